//! Belief overlaps, classified (issue 33). Pure: actors record each
//! belief (a leadership or a permit, from the call's return to the last
//! `is_held() == true`, with the session's trusted-until as sampled and
//! the first refused fenced call), an independent raw history records
//! every DELETE with its revision and arrival; the functions here find
//! every instant at which more holders believed than the capacity allows
//! (1 for an election, N for a semaphore of N permits) and classify it:
//!
//! * **server early revocation**: the holders beyond the capacity are
//!   holders whose key etcd had deleted (it arrived in the history at the
//!   instant, or at most [`ARRIVAL_SKEW`] after) with its lease (the lease
//!   was gone right after: no resign or withdraw by the holder itself)
//!   while that holder's session was still trusted: its
//!   `session_trusted_until()`, as last sampled before the DELETE arrived,
//!   was still in the future. etcd revoked a lease its holder kept
//!   renewing (etcd-io/etcd#15247): no client-side deadline prevents that,
//!   only fencing does;
//! * **fleetcoord bug**: anything else (more live keys than the capacity,
//!   a DELETE after the holder's own deadline, a key deleted while its
//!   lease lived on, no DELETE at all).
//!
//! And what the holders can see as evidence of a lost key: a refused
//! fenced call (`txn_if_leader` / `txn_if_held` answering `Ok(None)`:
//! the holder's key at its create revision is gone). A belief must end by
//! the return of the first one; [`outlived_refusal`] lists those that did
//! not (beyond a bound for polling and scheduling).
//!
//! Shared by the soak and the leader-pause test; it needs the including
//! crate to declare `mod raw_history` at its root.
#![allow(dead_code)]

use crate::raw_history::{deletion, Change};
use std::time::{Duration, Instant};

/// How much later than a new holder's election its predecessor's DELETE
/// may arrive in the history and still count as having happened before
/// it (the history's watch threads can be scheduled late on a loaded
/// machine; etcd applied the DELETE before the new holder could read it).
pub const ARRIVAL_SKEW: Duration = Duration::from_millis(50);

/// One leadership or permit, as its holder saw it.
#[derive(Clone, Debug)]
pub struct Belief {
    /// `candidate 1`, `contender 3`: for the report.
    pub who: String,
    pub token: i64,
    pub key: String,
    /// When the campaign or acquire returned it.
    pub from: Instant,
    /// The start of the last poll that found `is_held()` true (`from` if
    /// none did).
    pub last_held_at: Instant,
    /// Ended by a loss, not by a resign or release.
    pub lost: bool,
    /// The session's trusted-until at each poll where it changed:
    /// (sampled at, value).
    pub trusted: Vec<(Instant, Option<Instant>)>,
    /// When the first refused fenced call returned.
    pub first_refusal: Option<Instant>,
}

impl Belief {
    /// The session's trusted-until as last sampled at or before `at`; for
    /// a belief that began after `at` (a campaign whose final read came
    /// just before its key's DELETE), the first sample: it still comes
    /// from renewals of this lease that etcd answered (a session that knew
    /// its lease gone has no trusted-until).
    pub fn trusted_at(&self, at: Instant) -> Option<Instant> {
        match self
            .trusted
            .iter()
            .rev()
            .find(|(sampled, _)| *sampled <= at)
        {
            Some((_, v)) => *v,
            None => self.trusted.first().and_then(|(_, v)| *v),
        }
    }

    fn open_at(&self, at: Instant) -> bool {
        self.from <= at && at < self.last_held_at
    }
}

/// An instant with more believing holders than the capacity.
#[derive(Clone, Debug)]
pub struct Overlap {
    /// The belief whose start made it one too many.
    pub newest: usize,
    /// Every belief open at that instant (indices into the beliefs).
    pub holders: Vec<usize>,
    /// How long the oldest stale belief went on after the instant.
    pub length: Duration,
    pub early_revocation: bool,
    /// Every holder with its key's DELETE and trusted-until, one line each.
    pub report: String,
}

/// Every instant at which more than `capacity` of `beliefs` believed at
/// once, classified (see the module docs). `origin` is the run's clock
/// zero for the report.
pub fn overlaps(
    beliefs: &[Belief],
    capacity: usize,
    changes: &[Change],
    origin: Instant,
) -> Vec<Overlap> {
    let at = |t: Instant| secs(t, origin);
    let mut found = Vec::new();
    for (n, newest) in beliefs.iter().enumerate() {
        let t = newest.from;
        let holders: Vec<usize> = beliefs
            .iter()
            .enumerate()
            .filter(|(i, b)| *i == n || (b.open_at(t) && (b.from, *i) < (t, n)))
            .map(|(i, _)| i)
            .collect();
        if holders.len() <= capacity {
            continue;
        }
        let mut live = 0;
        let mut all_early = true;
        let mut lines = Vec::new();
        let mut length = Duration::ZERO;
        for &i in &holders {
            let b = &beliefs[i];
            let delete = deletion(changes, &b.key, b.token);
            let stale = delete.filter(|d| d.arrived <= t + ARRIVAL_SKEW);
            let line = match stale {
                None => {
                    live += 1;
                    format!(
                        "{} (token {}) from {}, believed until {}: its key {}",
                        b.who,
                        b.token,
                        at(b.from),
                        at(b.last_held_at),
                        delete.map_or("was never deleted".to_string(), |d| format!(
                            "was deleted later (revision {}, seen {})",
                            d.revision,
                            at(d.arrived)
                        ))
                    )
                }
                Some(d) => {
                    length = length.max(b.last_held_at.saturating_duration_since(t));
                    let trusted = b.trusted_at(d.arrived);
                    let early =
                        trusted.is_some_and(|u| u > d.arrived) && d.lease_gone == Some(true);
                    all_early &= early;
                    format!(
                        "{} (token {}, key {}) believed until {} although etcd deleted its key \
                         at revision {} (lease {:x}, {}), seen at {} (member {}), when its session \
                         was trusted until {}: {}{}; its first refused fenced call returned {}",
                        b.who,
                        b.token,
                        b.key,
                        at(b.last_held_at),
                        d.revision,
                        d.lease,
                        match d.lease_gone {
                            Some(true) => "gone with it",
                            Some(false) => "alive after: no revocation",
                            None => "unknown whether it lived on",
                        },
                        at(d.arrived),
                        d.member,
                        trusted.map_or("(none sampled)".to_string(), at),
                        match trusted {
                            Some(u) if u > d.arrived => format!("{:.1?} ahead", u - d.arrived),
                            Some(u) => format!("{:.1?} past it", d.arrived - u),
                            None => "no trusted-until to compare".to_string(),
                        },
                        if b.from > d.arrived {
                            " (elected after that DELETE: its campaign's last read came first)"
                        } else {
                            ""
                        },
                        b.first_refusal.map_or("never".to_string(), at)
                    )
                }
            };
            lines.push(line);
        }
        found.push(Overlap {
            newest: n,
            holders: holders.clone(),
            length,
            early_revocation: live <= capacity && all_early,
            report: format!(
                "{} believing holders of {capacity} at {} ({} elected then):\n    {}",
                holders.len(),
                at(t),
                newest.who,
                lines.join("\n    ")
            ),
        });
    }
    found
}

/// One line for every belief seen after its first refused fenced call
/// returned, by more than `bound`.
pub fn outlived_refusal(beliefs: &[Belief], bound: Duration, origin: Instant) -> Vec<String> {
    beliefs
        .iter()
        .filter_map(|b| {
            let refused = b.first_refusal?;
            (b.last_held_at > refused + bound).then(|| {
                format!(
                    "{} (token {}) believed {:.1?} after its fenced call was refused (returned \
                     {}, last held {}, bound {bound:?})",
                    b.who,
                    b.token,
                    b.last_held_at - refused,
                    secs(refused, origin),
                    secs(b.last_held_at, origin)
                )
            })
        })
        .collect()
}

/// Signed ms from the first refused fenced call's return to the last
/// belief, per belief that had one (negative: belief ended first).
pub fn refusal_to_belief_end(beliefs: &[Belief]) -> Vec<f64> {
    beliefs
        .iter()
        .filter_map(|b| Some(ms_between(b.last_held_at, b.first_refusal?)))
        .collect()
}

/// Signed ms from the DELETE of a lost holder's key (as the history saw
/// it) to its last belief (negative: belief ended first).
pub fn delete_to_belief_end(beliefs: &[Belief], changes: &[Change]) -> Vec<f64> {
    beliefs
        .iter()
        .filter(|b| b.lost)
        .filter_map(|b| {
            let d = deletion(changes, &b.key, b.token)?;
            Some(ms_between(b.last_held_at, d.arrived))
        })
        .collect()
}

/// `a - b` in milliseconds, negative when `a` came first.
pub fn ms_between(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1e3
    } else {
        -(b - a).as_secs_f64() * 1e3
    }
}

/// `t` on the run's clock: seconds since `origin`.
pub fn secs(t: Instant, origin: Instant) -> String {
    format!("{:.3}s", t.saturating_duration_since(origin).as_secs_f64())
}

/// `name: n = …, min …, p50 …, p90 …, max …` of signed milliseconds.
pub fn signed_distribution(name: &str, values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return format!("{name}: n = 0");
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "{name}: n = {}, min {:.1} ms, p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        v.len(),
        at(0.0),
        at(0.5),
        at(0.9),
        at(1.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    fn belief(who: &str, token: i64, from: u64, to: u64, trusted: u64, t0: Instant) -> Belief {
        Belief {
            who: who.into(),
            token,
            key: format!("/e/{token}"),
            from: ms(t0, from),
            last_held_at: ms(t0, to),
            lost: true,
            trusted: vec![(ms(t0, from), Some(ms(t0, trusted)))],
            first_refusal: None,
        }
    }

    fn delete(token: i64, revision: i64, at: u64, t0: Instant) -> Change {
        Change {
            revision,
            key: format!("/e/{token}"),
            delete: true,
            create_revision: token,
            lease: 1,
            arrived: ms(t0, at),
            member: 0,
            lease_gone: Some(true),
        }
    }

    #[test]
    fn a_key_deleted_before_its_trusted_until_is_a_server_early_revocation() {
        let t0 = Instant::now();
        // Holder 10 trusted until 1500 ms; etcd deletes its key at 1000,
        // holder 20 is elected at 1005 while 10 believes until 1060.
        let beliefs = [
            belief("a", 10, 0, 1060, 1500, t0),
            belief("b", 20, 1005, 2000, 3000, t0),
        ];
        let changes = [delete(10, 30, 1000, t0)];
        let found = overlaps(&beliefs, 1, &changes, t0);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].early_revocation, "{}", found[0].report);
        assert_eq!(found[0].length, Duration::from_millis(55));
    }

    #[test]
    fn a_belief_past_the_trusted_until_or_without_a_delete_is_a_bug() {
        let t0 = Instant::now();
        let changes = [delete(10, 30, 1000, t0)];
        // Trusted only until 900: etcd deleted in time, the belief is late.
        let late = [
            belief("a", 10, 0, 1060, 900, t0),
            belief("b", 20, 1005, 2000, 3000, t0),
        ];
        let found = overlaps(&late, 1, &changes, t0);
        assert_eq!(found.len(), 1);
        assert!(!found[0].early_revocation, "{}", found[0].report);
        // Deleted in time but its lease lived on: the holder's own delete
        // (a resign), believed after it.
        let mut resigned = changes.clone();
        resigned[0].lease_gone = Some(false);
        let trusted = [
            belief("a", 10, 0, 1060, 1500, t0),
            belief("b", 20, 1005, 2000, 3000, t0),
        ];
        assert!(overlaps(&trusted, 1, &changes, t0)[0].early_revocation);
        assert!(!overlaps(&trusted, 1, &resigned, t0)[0].early_revocation);
        // Nothing deleted at all: two live keys believed.
        let found = overlaps(&late, 1, &[], t0);
        assert!(!found[0].early_revocation);
        // The semaphore case: three believers of two permits, one of
        // them revoked early, is a server early revocation; with two
        // permits and three live keys it is a bug.
        let three = [
            belief("a", 10, 0, 1060, 1500, t0),
            belief("b", 15, 100, 2000, 3000, t0),
            belief("c", 20, 1005, 2000, 3000, t0),
        ];
        assert!(overlaps(&three, 2, &changes, t0)[0].early_revocation);
        assert!(!overlaps(&three, 2, &[], t0)[0].early_revocation);
        // Back to back is no overlap.
        let touching = [
            belief("a", 10, 0, 1000, 1500, t0),
            belief("b", 20, 1000, 2000, 3000, t0),
        ];
        assert!(overlaps(&touching, 1, &changes, t0).is_empty());
    }

    #[test]
    fn a_belief_after_a_refusal_is_reported() {
        let t0 = Instant::now();
        let mut b = belief("a", 10, 0, 1060, 1500, t0);
        b.first_refusal = Some(ms(t0, 1003));
        let found = outlived_refusal(&[b.clone()], Duration::from_millis(10), t0);
        assert_eq!(found.len(), 1, "{found:?}");
        b.last_held_at = ms(t0, 1010);
        assert!(outlived_refusal(&[b], Duration::from_millis(10), t0).is_empty());
    }
}
