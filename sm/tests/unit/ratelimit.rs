//! Exact answers of a fleet-wide rate limit's share
//! (`fleetcoord_sm::ratelimit`): when a member may spend, how much, and
//! when it must ask again, numbered as the module's invariants.

use fleetcoord_sm::ratelimit::*;
use std::time::{Duration, Instant};

const W: Duration = Duration::from_millis(1_000);
const LAG: Duration = Duration::from_millis(500);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config(permits: u32) -> RateConfig {
    RateConfig {
        permits,
        window: W,
        lag: LAG,
    }
}

/// Member `me` of a view of `others` plus itself, registered at `t0`,
/// trusted for an hour, synced: it may spend from `t0 + W + LAG`.
fn member(permits: u32, me: u32, others: &[u32], t0: Instant) -> RateShare<u32> {
    let mut share = RateShare::new(config(permits), me).expect("valid config");
    share.registered(t0);
    share.trusted(t0 + Duration::from_secs(3600));
    share.member_up(me);
    for &id in others {
        share.member_up(id);
    }
    share.synced();
    share
}

#[test]
fn shares_of_one_view_add_up_to_the_permits() {
    for permits in 1..40u32 {
        for n in 1..12usize {
            let total: u32 = (0..n).map(|k| share(permits, k, n)).sum();
            assert_eq!(total, permits, "R {permits}, n {n}");
            // Adding a member never raises a share (the module docs' proof),
            // whichever rank it takes.
            for k in 0..n {
                for inserted_below in [false, true] {
                    let k2 = if inserted_below { k + 1 } else { k };
                    assert!(share(permits, k2, n + 1) <= share(permits, k, n));
                }
            }
        }
    }
    assert_eq!(share(7, 0, 0), 0);
    assert_eq!(share(7, 2, 3), 2);
    assert_eq!(share(7, 0, 3), 3);
}

/// Invariant 1: at most the share in any window, and the answer names the
/// instant the oldest grant leaves it.
#[test]
fn a_window_holds_at_most_the_share() {
    let t0 = Instant::now();
    let mut share = member(10, 1, &[2], t0); // rank 0 of 2: 5 permits
    assert_eq!(share.share(), 5);
    let start = t0 + W + LAG;
    for i in 0..5u64 {
        assert_eq!(share.try_acquire(start + ms(i * 100)), Grant::Granted);
    }
    assert_eq!(share.spent(start + ms(400)), 5);
    assert_eq!(share.try_acquire(start + ms(450)), Grant::At(start + W));
    assert_eq!(share.try_acquire(start + W - ms(1)), Grant::At(start + W));
    // The first grant leaves the window at exactly start + W.
    assert_eq!(share.try_acquire(start + W), Grant::Granted);
    assert_eq!(share.try_acquire(start + W), Grant::At(start + W + ms(100)));
    assert_eq!(share.release_at(), Some(start + W + W));
}

/// Invariant 2: nothing before the view is whole, nothing after it is not.
#[test]
fn only_a_whole_view_is_a_share() {
    let t0 = Instant::now();
    let mut share = RateShare::new(config(4), 1u32).expect("valid");
    share.registered(t0);
    share.trusted(t0 + Duration::from_secs(60));
    share.member_up(1);
    let start = t0 + W + LAG;
    assert_eq!(share.try_acquire(start), Grant::Fact);
    share.synced();
    assert_eq!(share.try_acquire(start), Grant::Granted);
    share.unsynced();
    assert_eq!(share.try_acquire(start + ms(1)), Grant::Fact);
    share.synced();
    assert_eq!(share.try_acquire(start + ms(2)), Grant::Granted);
}

/// Invariant 3: a joiner waits W + lag after its key was written, and a
/// new lease is a new join.
#[test]
fn a_joiner_waits_until_everyone_counted_it() {
    let t0 = Instant::now();
    let mut share = member(4, 1, &[], t0);
    assert_eq!(share.try_acquire(t0), Grant::At(t0 + W + LAG));
    assert_eq!(
        share.try_acquire(t0 + W + LAG - ms(1)),
        Grant::At(t0 + W + LAG)
    );
    assert_eq!(share.try_acquire(t0 + W + LAG), Grant::Granted);
    // The lease is lost: nothing until the next registration, which waits
    // its own W + lag.
    share.lost();
    let t1 = t0 + ms(5_000);
    assert_eq!(share.try_acquire(t1), Grant::Fact);
    share.registered(t1);
    share.trusted(t1 + Duration::from_secs(10));
    assert_eq!(share.try_acquire(t1), Grant::At(t1 + W + LAG));
    assert_eq!(share.try_acquire(t1 + W + LAG), Grant::Granted);
}

/// Invariant 4: a grant's window ends by the session's deadline; a member
/// whose renewals stopped stops granting W before it.
#[test]
fn no_grant_whose_window_outlives_the_trust() {
    let t0 = Instant::now();
    let mut share = member(4, 1, &[], t0);
    let start = t0 + W + LAG;
    share.trusted(start + W);
    assert_eq!(share.try_acquire(start), Grant::Granted);
    assert_eq!(share.try_acquire(start + ms(1)), Grant::Fact);
    // A renewal moves the deadline: granting resumes.
    share.trusted(start + W + ms(10));
    assert_eq!(share.try_acquire(start + ms(1)), Grant::Granted);
    assert_eq!(share.try_acquire(start + ms(11)), Grant::Fact);
    // No deadline known (the session between states): nothing, and the
    // join stands once it is known again.
    share.untrusted();
    assert_eq!(share.try_acquire(start + ms(12)), Grant::Fact);
    share.trusted(start + ms(5_000));
    assert_eq!(share.try_acquire(start + ms(12)), Grant::Granted);
}

/// Joins shrink the share, leaves grow it, with the member's rank.
#[test]
fn the_share_follows_the_view() {
    let t0 = Instant::now();
    let mut share = member(10, 5, &[], t0);
    assert_eq!((share.members(), share.share()), (1, 10));
    share.member_up(9);
    assert_eq!((share.members(), share.share()), (2, 5));
    share.member_up(1);
    // Ranks 0, 1, 2 of 3: 4, 3, 3; member 5 is rank 1.
    assert_eq!((share.members(), share.share()), (3, 3));
    share.member_down(&1);
    share.member_down(&9);
    assert_eq!(share.share(), 10);
    // Its own key gone from the view (an expiry seen before the loss):
    // still counted, never a share of a view without itself.
    share.member_down(&5);
    assert_eq!((share.members(), share.share()), (1, 10));
}

/// A share of 0 (more members than permits) grants nothing, ever, until
/// the view changes.
#[test]
fn more_members_than_permits() {
    let t0 = Instant::now();
    let mut share = member(2, 3, &[1, 2], t0);
    assert_eq!(share.share(), 0);
    assert_eq!(share.try_acquire(t0 + W + LAG), Grant::Fact);
    share.member_down(&1);
    assert_eq!(share.try_acquire(t0 + W + LAG), Grant::Granted);
}

/// A caller with an older clock reading than an earlier grant's still
/// counts that grant, and a release waits for the newest one.
#[test]
fn grants_out_of_order_still_count() {
    let t0 = Instant::now();
    let mut share = member(2, 1, &[], t0);
    let start = t0 + W + LAG;
    assert_eq!(share.try_acquire(start + ms(100)), Grant::Granted);
    assert_eq!(share.try_acquire(start + ms(50)), Grant::Granted);
    assert_eq!(
        share.try_acquire(start + ms(60)),
        Grant::At(start + ms(1_100))
    );
    assert_eq!(share.release_at(), Some(start + ms(1_100)));
}

/// Bad configurations are refused, naming the field.
#[test]
fn bad_configs_are_refused() {
    let bad = |c: RateConfig| RateShare::new(c, 0u8).expect_err("refused").what;
    assert_eq!(bad(config(0)), "permits");
    assert_eq!(bad(config(MAX_PERMITS + 1)), "permits");
    assert_eq!(
        bad(RateConfig {
            window: ms(9),
            ..config(1)
        }),
        "window"
    );
    assert_eq!(
        bad(RateConfig {
            window: MAX_WINDOW + ms(1),
            ..config(1)
        }),
        "window"
    );
    assert_eq!(
        bad(RateConfig {
            lag: Duration::MAX,
            ..config(1)
        }),
        "lag"
    );
    assert!(RateShare::new(config(MAX_PERMITS), 0u8).is_ok());
}
