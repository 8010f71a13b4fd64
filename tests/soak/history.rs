//! The soak run's recorded history and the checker over it. Pure: the
//! actors append records while faults fly; [`check`] reads them afterwards
//! and lists every violation of:
//!
//! * **no belief overlap but a server early revocation** ([`beliefs`]):
//!   at no instant do more candidates believe they lead (from the
//!   campaign's return to the last `is_held() == true`) than one, or more
//!   contenders that they hold than the permits, unless the holders beyond
//!   that are ones whose key etcd deleted while their session was still
//!   trusted (`session_trusted_until()` as last sampled before the DELETE,
//!   in the raw history, was still ahead): etcd revoked a lease its holder
//!   kept renewing (etcd-io/etcd#15247, a paused raft leader that
//!   resumes), which no client can prevent. Each overlap is printed with
//!   its classification and evidence (`../common/belief.rs`);
//! * **no belief after the evidence**: the evidence a holder can see of a
//!   lost key is a refused fenced call (candidates: `txn_if_leader` every
//!   20 ms; contenders: an empty `txn_if_held` every 20 ms), which etcd
//!   answers `Ok(None)` once the holder's key at its create revision is
//!   gone. A belief may not be seen more than 10 ms after the first such
//!   call returned: the call's own round trip is all the time the holder
//!   gets (the holder's loop polls `is_held()` only between calls, so any
//!   belief seen after the refusal is at least one poll interval late).
//!   A DELETE of the holder's key in the raw history is no bound of its
//!   own here (a holder sees it only at its next call or renewal): its
//!   distance to the belief's end is printed;
//! * **tokens increase**: ordered by election time, fencing tokens strictly
//!   increase;
//! * **stale fenced writes are refused**: ordered by the etcd revision they
//!   were applied at, the tokens of successful fenced writes never go down
//!   (a deposed leader's write never lands after its successor's);
//! * **streams exactly once, in order**: each reader's ids strictly
//!   increase, every acknowledged append is read with its payload, and an
//!   entry read but never acknowledged (its append timed out) is read once.
//!
//! The watcher's convergence is checked live, after each quiet period, by
//! the run itself (it needs etcd's state at that moment).

use crate::belief::{self, Belief, Overlap};
use crate::raw_history::Change;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How long after its first refused fenced call a holder may still be
/// seen believing.
pub const EVIDENCE_BOUND: Duration = Duration::from_millis(10);

/// One leadership as a candidate saw it.
#[derive(Clone, Debug)]
pub struct Tenure {
    pub candidate: usize,
    pub token: i64,
    pub key: String,
    pub elected_at: Instant,
    /// The last instant `is_held()` was observed true.
    pub last_held_at: Instant,
    /// Ended by a loss, not a resign.
    pub lost: bool,
    /// The election's `session_trusted_until()` at each poll where it
    /// changed: (sampled at, value).
    pub trusted: Vec<(Instant, Option<Instant>)>,
    /// When its first refused fenced write returned.
    pub first_refusal: Option<Instant>,
}

impl Tenure {
    pub fn belief(&self) -> Belief {
        Belief {
            who: format!("candidate {}", self.candidate),
            token: self.token,
            key: self.key.clone(),
            from: self.elected_at,
            last_held_at: self.last_held_at,
            lost: self.lost,
            trusted: self.trusted.clone(),
            first_refusal: self.first_refusal,
        }
    }
}

/// A fenced write etcd applied: the token it was fenced on and the
/// revision it landed at.
#[derive(Clone, Copy, Debug)]
pub struct FencedWrite {
    pub token: i64,
    pub revision: i64,
}

/// What the stream actors did, per stream.
#[derive(Clone, Debug, Default)]
pub struct StreamLog {
    /// Appends etcd acknowledged: id → payload.
    pub acked: BTreeMap<u64, Vec<u8>>,
    /// Payloads whose append failed (outcome unknown).
    pub unacked: Vec<Vec<u8>>,
    /// Each reader's entries in the order read.
    pub reads: Vec<Vec<(u64, Vec<u8>)>>,
}

/// One semaphore permit as its contender saw it.
#[derive(Clone, Debug)]
pub struct Permit {
    pub contender: usize,
    pub token: i64,
    pub key: String,
    /// When `acquire_timeout` returned it.
    pub from: Instant,
    /// The last instant `is_held()` was observed true.
    pub last_held_at: Instant,
    /// Ended by a loss, not a release.
    pub lost: bool,
    /// The semaphore's `session_trusted_until()` at each poll where it
    /// changed: (sampled at, value).
    pub trusted: Vec<(Instant, Option<Instant>)>,
    /// When its first refused `txn_if_held` returned.
    pub first_refusal: Option<Instant>,
}

impl Permit {
    pub fn belief(&self) -> Belief {
        Belief {
            who: format!("contender {}", self.contender),
            token: self.token,
            key: self.key.clone(),
            from: self.from,
            last_held_at: self.last_held_at,
            lost: self.lost,
            trusted: self.trusted.clone(),
            first_refusal: self.first_refusal,
        }
    }
}

#[derive(Default)]
pub struct History {
    pub tenures: Vec<Tenure>,
    pub permits: Vec<Permit>,
    pub writes: Vec<FencedWrite>,
    pub streams: Vec<StreamLog>,
    /// Every change of the candidates' and contenders' keys, from the raw
    /// watches (`../common/raw_history.rs`), in revision order.
    pub changes: Vec<Change>,
}

/// The belief overlaps of one workload, classified.
pub struct Beliefs {
    /// `"leaderships"` or `"permits"`.
    pub what: &'static str,
    pub beliefs: Vec<Belief>,
    pub overlaps: Vec<Overlap>,
}

impl Beliefs {
    pub fn early_revocations(&self) -> usize {
        self.overlaps.iter().filter(|o| o.early_revocation).count()
    }

    /// One line: how many overlaps, how classified.
    pub fn summary(&self) -> String {
        format!(
            "{} overlaps of {}: {} server early revocation, {} fleetcoord bug",
            self.overlaps.len(),
            self.what,
            self.early_revocations(),
            self.overlaps.len() - self.early_revocations()
        )
    }
}

/// The candidates' leaderships (one at a time) and the contenders' permits
/// (`permits` at a time), each overlap classified.
pub fn beliefs(history: &History, permits: usize, origin: Instant) -> [Beliefs; 2] {
    let mut tenures = history.tenures.clone();
    tenures.sort_by_key(|t| t.elected_at);
    let leaderships: Vec<Belief> = tenures.iter().map(Tenure::belief).collect();
    let mut holds = history.permits.clone();
    holds.sort_by_key(|p| p.from);
    let holds: Vec<Belief> = holds.iter().map(Permit::belief).collect();
    [
        Beliefs {
            what: "leaderships",
            overlaps: belief::overlaps(&leaderships, 1, &history.changes, origin),
            beliefs: leaderships,
        },
        Beliefs {
            what: "permits",
            overlaps: belief::overlaps(&holds, permits, &history.changes, origin),
            beliefs: holds,
        },
    ]
}

/// The tenures, in election order, of each adjacent pair that overlaps
/// or whose tokens do not increase: what [`check`] reports, for a
/// timeline of the two.
pub fn suspect_pairs(tenures: &[Tenure]) -> Vec<(Tenure, Tenure)> {
    let mut tenures = tenures.to_vec();
    tenures.sort_by_key(|t| t.elected_at);
    tenures
        .windows(2)
        .filter(|p| p[1].elected_at < p[0].last_held_at || p[1].token <= p[0].token)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

/// Every violation found, one line each; empty when the history is clean.
/// `permits` is the semaphore's, `origin` the run's clock zero.
pub fn check(history: &History, permits: usize, origin: Instant) -> Vec<String> {
    let mut violations = Vec::new();
    for workload in beliefs(history, permits, origin) {
        for o in workload.overlaps.iter().filter(|o| !o.early_revocation) {
            violations.push(format!(
                "overlap of {} (fleetcoord bug): {}",
                workload.what, o.report
            ));
        }
        violations.extend(belief::outlived_refusal(
            &workload.beliefs,
            EVIDENCE_BOUND,
            origin,
        ));
    }
    let mut tenures = history.tenures.clone();
    tenures.sort_by_key(|t| t.elected_at);
    for pair in tenures.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.token <= a.token {
            violations.push(format!(
                "token regression: {} elected after {}",
                b.token, a.token
            ));
        }
    }
    let mut writes = history.writes.clone();
    writes.sort_by_key(|w| w.revision);
    for pair in writes.windows(2) {
        if pair[1].token < pair[0].token {
            violations.push(format!(
                "stale fenced write: token {} applied at revision {} after token {} at revision {}",
                pair[1].token, pair[1].revision, pair[0].token, pair[0].revision
            ));
        }
    }
    for (s, log) in history.streams.iter().enumerate() {
        for (r, read) in log.reads.iter().enumerate() {
            for pair in read.windows(2) {
                if pair[1].0 <= pair[0].0 {
                    violations.push(format!(
                        "stream {s} reader {r}: id {} after {} (duplicate or out of order)",
                        pair[1].0, pair[0].0
                    ));
                }
            }
            let got: HashMap<u64, &Vec<u8>> = read.iter().map(|(id, p)| (*id, p)).collect();
            for (id, payload) in &log.acked {
                match got.get(id) {
                    None => violations.push(format!(
                        "stream {s} reader {r}: acknowledged entry {id} never read"
                    )),
                    Some(p) if *p != payload => violations.push(format!(
                        "stream {s} reader {r}: entry {id} read with another payload"
                    )),
                    Some(_) => {}
                }
            }
            for (id, payload) in read {
                if !log.acked.contains_key(id) && !log.unacked.contains(payload) {
                    violations.push(format!(
                        "stream {s} reader {r}: entry {id} was never appended"
                    ));
                }
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenure(candidate: usize, token: i64, from_ms: u64, to_ms: u64, t0: Instant) -> Tenure {
        Tenure {
            candidate,
            token,
            key: format!("/e/{token}"),
            elected_at: t0 + Duration::from_millis(from_ms),
            last_held_at: t0 + Duration::from_millis(to_ms),
            lost: false,
            // Trusted 1.5 s from the election on.
            trusted: vec![(
                t0 + Duration::from_millis(from_ms),
                Some(t0 + Duration::from_millis(from_ms + 1500)),
            )],
            first_refusal: None,
        }
    }

    /// etcd's DELETE of the key of `token`, seen at `at_ms`.
    fn deleted(token: i64, revision: i64, at_ms: u64, t0: Instant) -> Change {
        Change {
            revision,
            key: format!("/e/{token}"),
            delete: true,
            create_revision: token,
            lease: 1,
            arrived: t0 + Duration::from_millis(at_ms),
            member: 0,
            lease_gone: Some(true),
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let t0 = Instant::now();
        let mut stream = StreamLog::default();
        stream.acked.insert(1, b"a".to_vec());
        stream.acked.insert(2, b"b".to_vec());
        stream.unacked.push(b"c".to_vec());
        stream.reads.push(vec![
            (1, b"a".to_vec()),
            (2, b"b".to_vec()),
            (3, b"c".to_vec()),
        ]);
        let history = History {
            tenures: vec![tenure(0, 10, 0, 100, t0), tenure(1, 20, 150, 300, t0)],
            writes: vec![
                FencedWrite {
                    token: 10,
                    revision: 11,
                },
                FencedWrite {
                    token: 20,
                    revision: 21,
                },
            ],
            streams: vec![stream],
            permits: Vec::new(),
            changes: Vec::new(),
        };
        assert_eq!(check(&history, 2, t0), Vec::<String>::new());
    }

    #[test]
    fn every_kind_of_violation_is_found() {
        let t0 = Instant::now();
        let mut stream = StreamLog::default();
        stream.acked.insert(1, b"a".to_vec());
        stream.acked.insert(2, b"b".to_vec());
        stream.reads.push(vec![
            (2, b"b".to_vec()),
            (2, b"b".to_vec()),
            (7, b"z".to_vec()),
        ]);
        let history = History {
            tenures: vec![tenure(0, 10, 0, 200, t0), tenure(1, 9, 150, 300, t0)],
            writes: vec![
                FencedWrite {
                    token: 20,
                    revision: 11,
                },
                FencedWrite {
                    token: 10,
                    revision: 21,
                },
            ],
            streams: vec![stream],
            permits: Vec::new(),
            changes: Vec::new(),
        };
        let found = check(&history, 2, t0).join("\n");
        for what in [
            "overlap of leaderships (fleetcoord bug)",
            "token regression",
            "stale fenced write",
            "duplicate or out of order",
            "acknowledged entry 1 never read",
            "entry 7 was never appended",
        ] {
            assert!(found.contains(what), "{what} not found in:\n{found}");
        }
    }

    #[test]
    fn an_overlap_is_a_failure_unless_etcd_revoked_a_trusted_lease() {
        let t0 = Instant::now();
        // Candidate 0's key is deleted at 140 ms while it is trusted until
        // 1500 ms; candidate 1 is elected at 150, candidate 0 believes
        // until 200.
        let mut history = History {
            tenures: vec![tenure(0, 10, 0, 200, t0), tenure(1, 20, 150, 300, t0)],
            changes: vec![deleted(10, 21, 140, t0)],
            ..History::default()
        };
        assert_eq!(check(&history, 2, t0), Vec::<String>::new());
        let [leaderships, _] = beliefs(&history, 2, t0);
        assert_eq!(
            leaderships.early_revocations(),
            1,
            "{}",
            leaderships.summary()
        );
        // Its fenced write was refused at 160: believed 40 ms after.
        history.tenures[0].first_refusal = Some(t0 + Duration::from_millis(160));
        let found = check(&history, 2, t0).join("\n");
        assert!(
            found.contains("after its fenced call was refused"),
            "{found}"
        );
        // Without the DELETE it is a bug.
        history.tenures[0].first_refusal = None;
        history.changes.clear();
        let found = check(&history, 2, t0).join("\n");
        assert!(
            found.contains("overlap of leaderships (fleetcoord bug)"),
            "{found}"
        );
    }

    #[test]
    fn more_believing_holders_than_permits_are_found() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let permit = |contender, token: i64, from, to| Permit {
            contender,
            token,
            key: format!("/e/{token}"),
            from: at(from),
            last_held_at: at(to),
            lost: false,
            trusted: vec![(at(from), Some(at(from + 1500)))],
            first_refusal: None,
        };
        let history = |permits: Vec<Permit>, changes: Vec<Change>| History {
            permits,
            changes,
            ..History::default()
        };
        // Two at a time, one handing over at an instant: clean.
        let clean = vec![
            permit(0, 1, 0, 100),
            permit(1, 2, 10, 200),
            permit(2, 3, 100, 300),
        ];
        assert_eq!(check(&history(clean, vec![]), 2, t0), Vec::<String>::new());
        let three = vec![
            permit(0, 1, 0, 100),
            permit(1, 2, 10, 200),
            permit(2, 3, 99, 300),
        ];
        let found = check(&history(three.clone(), vec![]), 2, t0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("3 believing holders"), "{found:?}");
        // Contender 0's key deleted early at 98 ms: etcd's doing.
        let early = history(three, vec![deleted(1, 5, 98, t0)]);
        assert_eq!(check(&early, 2, t0), Vec::<String>::new());
    }
}
