//! The bus KV's conditional and expiring writes, decided once for every
//! backend: whether a compare-and-set applies, what a refused one means,
//! and which expiry times are accepted and how they are counted.
//!
//! Backends that check the condition on the server (an etcd transaction, a
//! Redis script, a NATS expected-sequence header) still ask [`refusal`]
//! what the server's refusal means, so that a revision that was never this
//! key's is reported the same way everywhere.

use std::time::Duration;

/// What a conditional write requires of the key it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Condition {
    /// Nothing: a plain set.
    Always,
    /// The key is absent (never set, deleted or expired).
    Absent,
    /// The key is present at exactly this revision.
    At(u64),
}

impl Condition {
    /// The condition of an expected revision as the bus API takes it:
    /// `None` for none, `Some(0)` for "only if absent".
    pub fn from_expected(expected: Option<u64>) -> Condition {
        match expected {
            None => Condition::Always,
            Some(0) => Condition::Absent,
            Some(revision) => Condition::At(revision),
        }
    }

    /// The revision the condition names, 0 for [`Condition::Absent`]
    /// (the number every store's "no revision" is), `None` for
    /// [`Condition::Always`].
    pub fn expected(self) -> Option<u64> {
        match self {
            Condition::Always => None,
            Condition::Absent => Some(0),
            Condition::At(revision) => Some(revision),
        }
    }
}

/// Whether a conditional write may apply, given the key's current
/// revision (`None`: absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The condition holds: write.
    Apply,
    /// Another write got there first: the key is at `current` (`None`:
    /// absent). The caller's answer is a conflict carrying it.
    Conflict {
        /// The key's revision when the condition was checked.
        current: Option<u64>,
    },
    /// The expected revision is newer than the key's current one. A key's
    /// revision only grows, so the caller never read it from this key: it
    /// came from another key, or was made up. The caller's answer is an
    /// invalid argument, not a conflict, since re-reading and retrying
    /// with a revision of the same origin would never succeed.
    NotThisKeys {
        /// The key's revision when the condition was checked.
        current: u64,
    },
}

/// Decides a conditional write against the key's `current` revision.
pub fn check(condition: Condition, current: Option<u64>) -> Verdict {
    match (condition, current) {
        (Condition::Always, _) | (Condition::Absent, None) => Verdict::Apply,
        (Condition::At(expected), Some(current)) if expected == current => Verdict::Apply,
        (Condition::At(expected), Some(current)) if expected > current => {
            Verdict::NotThisKeys { current }
        }
        (_, current) => Verdict::Conflict { current },
    }
}

/// What a store's refusal of a conditional write means, given the key's
/// revision read after the refusal (`None`: absent). A refusal is never
/// [`Verdict::Apply`]: should the key meanwhile hold the expected revision
/// again (it cannot, revisions only grow, but a store that lost its data
/// restarts its counters), the refusal still stands and is a conflict.
pub fn refusal(condition: Condition, current: Option<u64>) -> Verdict {
    match check(condition, current) {
        Verdict::Apply => Verdict::Conflict { current },
        other => other,
    }
}

/// The shortest expiry any backend accepts, so that a TTL that works on
/// one backend works on all: etcd grants no lease shorter than 1.5 times
/// its election timeout, 2 s with its default settings (etcd and NATS
/// count expiry in whole seconds).
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The longest expiry any backend accepts: a year, far beyond what a
/// presence marker or a cache line needs, and within every backend's own
/// limit (etcd's lease TTL, Redis' millisecond deadlines, NATS' TTL
/// header).
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Why an expiry time was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TtlError {
    /// Below [`MIN_TTL`] (zero included).
    TooShort,
    /// Above [`MAX_TTL`].
    TooLong,
}

/// An expiry time in the whole seconds every backend counts: `ttl`
/// rounded up (so a key never expires before the time asked for), within
/// [`MIN_TTL`] ..= [`MAX_TTL`].
pub fn ttl_secs(ttl: Duration) -> Result<u64, TtlError> {
    if ttl < MIN_TTL {
        return Err(TtlError::TooShort);
    }
    if ttl > MAX_TTL {
        return Err(TtlError::TooLong);
    }
    let whole = ttl.as_secs();
    Ok(if ttl.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_condition_decides() {
        use Condition::*;
        assert_eq!(check(Always, None), Verdict::Apply);
        assert_eq!(check(Always, Some(9)), Verdict::Apply);
        assert_eq!(check(Absent, None), Verdict::Apply);
        assert_eq!(
            check(Absent, Some(3)),
            Verdict::Conflict { current: Some(3) }
        );
        assert_eq!(check(At(3), Some(3)), Verdict::Apply);
        assert_eq!(
            check(At(2), Some(3)),
            Verdict::Conflict { current: Some(3) }
        );
        assert_eq!(check(At(2), None), Verdict::Conflict { current: None });
        assert_eq!(check(At(4), Some(3)), Verdict::NotThisKeys { current: 3 });
    }

    #[test]
    fn a_refusal_is_never_a_win() {
        use Condition::*;
        assert_eq!(
            refusal(At(3), Some(3)),
            Verdict::Conflict { current: Some(3) }
        );
        assert_eq!(refusal(Absent, None), Verdict::Conflict { current: None });
        assert_eq!(refusal(At(7), Some(3)), Verdict::NotThisKeys { current: 3 });
    }

    #[test]
    fn expected_revisions_round_trip() {
        for expected in [None, Some(0), Some(1), Some(u64::MAX)] {
            assert_eq!(Condition::from_expected(expected).expected(), expected);
        }
    }

    #[test]
    fn ttls_round_up_within_the_range() {
        assert_eq!(ttl_secs(Duration::ZERO), Err(TtlError::TooShort));
        assert_eq!(
            ttl_secs(Duration::from_millis(1999)),
            Err(TtlError::TooShort)
        );
        assert_eq!(ttl_secs(Duration::from_secs(2)), Ok(2));
        assert_eq!(ttl_secs(Duration::from_millis(2001)), Ok(3));
        assert_eq!(ttl_secs(MAX_TTL), Ok(MAX_TTL.as_secs()));
        assert_eq!(
            ttl_secs(MAX_TTL + Duration::from_nanos(1)),
            Err(TtlError::TooLong)
        );
        assert_eq!(ttl_secs(Duration::MAX), Err(TtlError::TooLong));
    }
}
