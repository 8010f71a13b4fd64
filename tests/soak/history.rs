//! The soak run's recorded history and the checker over it. Pure: the
//! actors append records while faults fly; [`check`] reads them afterwards
//! and lists every violation of:
//!
//! * **no overlapping leadership**: the intervals during which candidates
//!   observed `is_held() == true` (from the campaign's return to the last
//!   observation) never overlap in time;
//! * **tokens increase**: ordered by election time, fencing tokens strictly
//!   increase;
//! * **stale fenced writes are refused**: ordered by the etcd revision they
//!   were applied at, the tokens of successful fenced writes never go down
//!   (a deposed leader's write never lands after its successor's);
//! * **at most N semaphore holders** ([`over_permits`]): the intervals
//!   during which contenders observed `is_held() == true` never number
//!   more than the permits at one instant;
//! * **streams exactly once, in order**: each reader's ids strictly
//!   increase, every acknowledged append is read with its payload, and an
//!   entry read but never acknowledged (its append timed out) is read once.
//!
//! The watcher's convergence is checked live, after each quiet period, by
//! the run itself (it needs etcd's state at that moment).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// One leadership as a candidate saw it.
#[derive(Clone, Debug)]
pub struct Tenure {
    pub candidate: usize,
    pub token: i64,
    pub elected_at: Instant,
    /// The last instant `is_held()` was observed true.
    pub last_held_at: Instant,
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
    /// When `acquire_timeout` returned it.
    pub from: Instant,
    /// The last instant `is_held()` was observed true.
    pub last_held_at: Instant,
}

#[derive(Default)]
pub struct History {
    pub tenures: Vec<Tenure>,
    pub permits: Vec<Permit>,
    pub writes: Vec<FencedWrite>,
    pub streams: Vec<StreamLog>,
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
pub fn check(history: &History) -> Vec<String> {
    let mut violations = Vec::new();
    let mut tenures = history.tenures.clone();
    tenures.sort_by_key(|t| t.elected_at);
    for pair in tenures.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.elected_at < a.last_held_at {
            violations.push(format!(
                "overlap: candidate {} (token {}) still held {:?} after candidate {} (token {}) was elected",
                a.candidate,
                a.token,
                a.last_held_at - b.elected_at,
                b.candidate,
                b.token
            ));
        }
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

/// One line for every instant at which more than `permits` contenders
/// believed they held (a hold counts from its acquire's return to its last
/// `is_held()` seen true).
pub fn over_permits(holds: &[Permit], permits: usize) -> Vec<String> {
    let mut edges: Vec<(Instant, i32, usize)> = holds
        .iter()
        .enumerate()
        .flat_map(|(i, p)| [(p.from, 1, i), (p.last_held_at, -1, i)])
        .collect();
    // Ends before starts at one instant: touching holds do not overlap.
    edges.sort_by_key(|&(at, d, _)| (at, d));
    let mut open: Vec<usize> = Vec::new();
    let mut violations = Vec::new();
    for (_, d, i) in edges {
        if d < 0 {
            open.retain(|&o| o != i);
            continue;
        }
        open.push(i);
        if open.len() > permits {
            let who: Vec<String> = open
                .iter()
                .map(|&o| {
                    format!(
                        "contender {} (token {})",
                        holds[o].contender, holds[o].token
                    )
                })
                .collect();
            violations.push(format!(
                "{} believing holders of {permits} permits at once: {}",
                open.len(),
                who.join(", ")
            ));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tenure(candidate: usize, token: i64, from_ms: u64, to_ms: u64, t0: Instant) -> Tenure {
        Tenure {
            candidate,
            token,
            elected_at: t0 + Duration::from_millis(from_ms),
            last_held_at: t0 + Duration::from_millis(to_ms),
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
        };
        assert_eq!(check(&history), Vec::<String>::new());
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
        };
        let found = check(&history).join("\n");
        for what in [
            "overlap",
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
    fn more_believing_holders_than_permits_are_found() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let permit = |contender, token, from, to| Permit {
            contender,
            token,
            from: at(from),
            last_held_at: at(to),
        };
        // Two at a time, one handing over at an instant: clean.
        let clean = [
            permit(0, 1, 0, 100),
            permit(1, 2, 10, 200),
            permit(2, 3, 100, 300),
        ];
        assert_eq!(over_permits(&clean, 2), Vec::<String>::new());
        let three = [
            permit(0, 1, 0, 100),
            permit(1, 2, 10, 200),
            permit(2, 3, 99, 300),
        ];
        let found = over_permits(&three, 2);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("3 believing holders"), "{found:?}");
    }
}
