//! The liveness half of a fault run's checker, shared by the soak and the
//! member-restart test. Pure: actors record what they did and when; the
//! functions here turn the records into the figures the liveness contract
//! bounds (README, "Liveness under faults"):
//!
//! * **leaderless time while a candidate waits**: every stretch between
//!   two leaderships (or after the last one) during which some candidate
//!   was inside a campaign call, split into the part that fell inside an
//!   *outage* (etcd without a raft leader, which no client can shorten)
//!   and the rest;
//! * **overruns**: every call with a bound (`campaign_timeout(d)` → d,
//!   `resign` → the request timeout) against the time it took;
//! * distributions of both, printed as p50 / p90 / max.
//!
//! A leadership counts from the campaign's return to the moment its holder
//! stopped believing (the resign call, or the first `is_held() == false`),
//! so recorded tenures sit inside the real ones: gaps measured here are
//! never shorter than the real gaps.
//!
//! Not every test that includes it uses every part.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// One leadership, as its candidate saw it.
#[derive(Clone, Debug)]
pub struct Held {
    pub candidate: usize,
    pub from: Instant,
    pub to: Instant,
    /// Ended by the holder's resign (rather than a loss).
    pub resigned: bool,
}

/// One campaign call: from the call to its return, whatever it returned.
#[derive(Clone, Copy, Debug)]
pub struct Waited {
    pub candidate: usize,
    pub from: Instant,
    pub to: Instant,
}

/// One call with a bound on how long it may take.
#[derive(Clone, Debug)]
pub struct Timed {
    pub what: &'static str,
    pub took: Duration,
    pub bound: Duration,
}

/// A stretch during which no client could make progress (etcd had no raft
/// leader): from the fault to the moment a new leader was seen.
#[derive(Clone, Copy, Debug)]
pub struct Outage {
    pub from: Instant,
    pub to: Instant,
    /// What it was (a fault's name), for the report.
    pub what: &'static str,
}

/// A stretch without a leader while some candidate waited.
#[derive(Clone, Debug)]
pub struct Gap {
    pub from: Instant,
    pub to: Instant,
    /// The leadership before it ended by a resign.
    pub after_resign: bool,
    /// The candidate that led before it, and the first that waited in it.
    pub holder: usize,
    pub waiter: usize,
    /// How much of it fell inside outages, and which they were.
    pub in_outage: Duration,
    pub during: Vec<&'static str>,
}

impl Gap {
    /// `leaderless for …` with who led before and who waited.
    pub fn describe(&self) -> String {
        format!(
            "leaderless for {:.2?} ({:.2?} outside outages {:?}) after candidate {} {}, while candidate {} waited",
            self.length(),
            self.excess(),
            self.during,
            self.holder,
            if self.after_resign { "resigned" } else { "lost" },
            self.waiter
        )
    }

    pub fn length(&self) -> Duration {
        self.to.saturating_duration_since(self.from)
    }

    /// The part no outage explains.
    pub fn excess(&self) -> Duration {
        self.length().saturating_sub(self.in_outage)
    }

    /// How much of it fell inside `outages` (another list than the one it
    /// was found with).
    pub fn within(&self, outages: &[Outage]) -> Duration {
        outages
            .iter()
            .map(|o| overlap(self.from, self.to, o.from, o.to))
            .sum()
    }

    /// How many of `outages` ended inside it.
    pub fn ended_inside(&self, outages: &[Outage]) -> u32 {
        let n = outages
            .iter()
            .filter(|o| o.to > self.from && o.to <= self.to)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// Every leaderless stretch while a candidate waited, up to `end` (when
/// the run stopped its candidates).
pub fn gaps(held: &[Held], waited: &[Waited], outages: &[Outage], end: Instant) -> Vec<Gap> {
    let mut held = held.to_vec();
    held.sort_by_key(|h| h.from);
    let mut gaps = Vec::new();
    for (i, h) in held.iter().enumerate() {
        let next = held.get(i + 1).map_or(end, |n| n.from);
        if next <= h.to {
            continue;
        }
        // The gap starts once somebody waits: at its end, or the first
        // campaign call made during it.
        let waiting_from = waited
            .iter()
            .filter(|w| w.to > h.to && w.from < next)
            .map(|w| (w.from.max(h.to), w.candidate))
            .min();
        let Some((from, waiter)) = waiting_from else {
            continue;
        };
        let in_outage = outages
            .iter()
            .map(|o| overlap(from, next, o.from, o.to))
            .sum();
        let during = outages
            .iter()
            .filter(|o| !overlap(from, next, o.from, o.to).is_zero())
            .map(|o| o.what)
            .collect();
        gaps.push(Gap {
            from,
            to: next,
            after_resign: h.resigned,
            holder: h.candidate,
            waiter,
            in_outage,
            during,
        });
    }
    gaps
}

fn overlap(a_from: Instant, a_to: Instant, b_from: Instant, b_to: Instant) -> Duration {
    let from = a_from.max(b_from);
    let to = a_to.min(b_to);
    to.saturating_duration_since(from)
}

/// Calls that took longer than their bound plus `slack`, one line each.
pub fn overruns(timed: &[Timed], slack: Duration) -> Vec<String> {
    timed
        .iter()
        .filter(|t| t.took > t.bound + slack)
        .map(|t| {
            format!(
                "{} took {:.2?}, bound {:.2?} + {slack:.1?}",
                t.what, t.took, t.bound
            )
        })
        .collect()
}

/// `name: n = …, p50 …, p90 …, max …` for `values`.
pub fn distribution(name: &str, values: &[Duration]) -> String {
    let mut v = values.to_vec();
    v.sort();
    if v.is_empty() {
        return format!("{name}: n = 0");
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "{name}: n = {}, p50 {:.2?}, p90 {:.2?}, max {:.2?}",
        v.len(),
        at(0.5),
        at(0.9),
        at(1.0)
    )
}

/// Every stretch during which fewer than `permits` of `held` were held
/// while some contender waited (inside one of `waited`), up to `end`: the
/// semaphore's counterpart of [`gaps`]. A stretch starts when it began or,
/// if later, when the first contender waiting in it called, and ends when
/// a permit is taken again (or at `end`). As with [`gaps`], recorded holds
/// sit inside the real ones, so stretches are never shorter than the real
/// ones. Only `from`, `to` and `waiter` of the returned gaps are meaningful.
pub fn short_of_permits(
    held: &[Held],
    waited: &[Waited],
    permits: usize,
    end: Instant,
) -> Vec<Gap> {
    let mut edges: Vec<(Instant, i32)> = held
        .iter()
        .flat_map(|h| [(h.from, 1), (h.to, -1)])
        .collect();
    // Ends before starts at one instant: a hand-over at an instant is no gap.
    edges.sort();
    let mut stretches = Vec::new();
    let mut open = 0i64;
    let mut short_since = waited.iter().map(|w| w.from).min();
    for (at, d) in edges {
        let before = open;
        open += i64::from(d);
        let full = i64::try_from(permits).unwrap_or(i64::MAX);
        if before >= full && open < full {
            short_since = Some(at);
        } else if before < full && open >= full {
            if let Some(from) = short_since.take() {
                stretches.push((from, at));
            }
        }
    }
    if let Some(from) = short_since {
        stretches.push((from, end));
    }
    let mut gaps = Vec::new();
    for (from, to) in stretches {
        let first = waited
            .iter()
            .filter(|w| w.from < to && w.to > from)
            .min_by_key(|w| w.from);
        let Some(w) = first else { continue };
        let start = from.max(w.from);
        if start < to {
            gaps.push(Gap {
                from: start,
                to,
                after_resign: false,
                holder: usize::MAX,
                waiter: w.candidate,
                in_outage: Duration::ZERO,
                during: Vec::new(),
            });
        }
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn gaps_count_only_while_someone_waits_and_split_off_outages() {
        let t0 = Instant::now();
        let held = vec![
            Held {
                candidate: 0,
                from: ms(t0, 0),
                to: ms(t0, 1000),
                resigned: true,
            },
            Held {
                candidate: 1,
                from: ms(t0, 3000),
                to: ms(t0, 4000),
                resigned: false,
            },
        ];
        // Candidate 1 waits from 500 ms; nobody waits after 4 s.
        let waited = vec![Waited {
            candidate: 1,
            from: ms(t0, 500),
            to: ms(t0, 3000),
        }];
        let outages = vec![Outage {
            from: ms(t0, 1500),
            to: ms(t0, 2000),
            what: "kill",
        }];
        let found = gaps(&held, &waited, &outages, ms(t0, 9000));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].length(), Duration::from_secs(2));
        assert!(found[0].after_resign);
        assert_eq!(found[0].excess(), Duration::from_millis(1500));
        assert_eq!(found[0].during, vec!["kill"]);
    }

    #[test]
    fn a_wait_that_starts_late_starts_the_gap_and_a_trailing_wait_counts() {
        let t0 = Instant::now();
        let held = vec![Held {
            candidate: 0,
            from: ms(t0, 0),
            to: ms(t0, 1000),
            resigned: false,
        }];
        let waited = vec![Waited {
            candidate: 2,
            from: ms(t0, 1200),
            to: ms(t0, 5000),
        }];
        let found = gaps(&held, &waited, &[], ms(t0, 5000));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].from, ms(t0, 1200));
        assert_eq!(found[0].length(), Duration::from_millis(3800));
    }

    #[test]
    fn overruns_name_the_call() {
        let timed = vec![
            Timed {
                what: "campaign_timeout(3s)",
                took: Duration::from_millis(4500),
                bound: Duration::from_secs(3),
            },
            Timed {
                what: "resign",
                took: Duration::from_millis(10),
                bound: Duration::from_secs(5),
            },
        ];
        let found = overruns(&timed, Duration::from_secs(1));
        assert_eq!(found.len(), 1);
        assert!(
            found[0].starts_with("campaign_timeout(3s) took"),
            "{found:?}"
        );
    }
}
