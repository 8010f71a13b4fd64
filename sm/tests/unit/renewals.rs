//! Exact command sequences of the renewals machine, one test per rule of
//! `fleetcoord_sm::renewals` (the rule numbers are its module docs').

use fleetcoord_sm::renewals::{Renewals, RenewalsCommand, RenewalsInput};
use fleetcoord_sm::{Backoff, BackoffConfig, LeaseId, RpcError};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(5);
const A: LeaseId = 10;
const B: LeaseId = 20;

type Cmd = RenewalsCommand<u64>;
type Input = RenewalsInput<u64>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn drain(m: &mut Renewals<u64>) -> Vec<Cmd> {
    std::iter::from_fn(|| m.poll_command()).collect()
}

/// Every write the open stream is given room for.
fn writes(m: &mut Renewals<u64>) -> Vec<LeaseId> {
    std::iter::from_fn(|| m.poll_write()).collect()
}

fn renew(lease: LeaseId, token: u64) -> Input {
    RenewalsInput::Renew { lease, token }
}

fn reply(lease: LeaseId, ttl_secs: i64) -> Input {
    RenewalsInput::Reply { lease, ttl_secs }
}

fn open(lease: LeaseId) -> Cmd {
    RenewalsCommand::Open { lease }
}

fn ttl(token: u64, ttl: i64) -> Cmd {
    RenewalsCommand::Answer {
        token,
        ttl: Ok(ttl),
    }
}

fn failed(token: u64, why: &str) -> Cmd {
    RenewalsCommand::Answer {
        token,
        ttl: Err(RpcError::Unavailable(why.into())),
    }
}

const NO_ANSWER: &str = "no renewal answer within 5s";

/// A machine at `t0` with an open stream on which renewal 1 of `A` was
/// written and answered.
fn open_stream(t0: Instant) -> Renewals<u64> {
    let mut m = Renewals::new(TIMEOUT, t0);
    m.handle(t0, renew(A, 1));
    assert_eq!(drain(&mut m), vec![open(A)]);
    assert_eq!(
        writes(&mut m),
        [],
        "nothing is written before the stream is open"
    );
    m.handle(t0 + ms(1), RenewalsInput::Opened);
    assert_eq!(drain(&mut m), []);
    assert_eq!(writes(&mut m), [A]);
    m.handle(t0 + ms(2), reply(A, 30));
    assert_eq!(drain(&mut m), vec![ttl(1, 30)]);
    assert_eq!(m.waiting(), 0);
    assert_eq!(m.poll_timeout(), None);
    m
}

#[test]
fn renewals_share_one_stream_and_replies_answer_the_oldest_renewal_of_their_lease() {
    let t0 = Instant::now();
    let mut m = Renewals::new(TIMEOUT, t0);
    // Rules 1 and 2: the first renewal opens a stream on its lease; the
    // second waits for the same stream.
    m.handle(t0, renew(A, 1));
    m.handle(t0 + ms(1), renew(B, 2));
    assert_eq!(drain(&mut m), vec![open(A)]);
    assert_eq!(m.poll_timeout(), Some(t0 + TIMEOUT));
    m.handle(t0 + ms(2), RenewalsInput::Opened);
    m.handle(t0 + ms(3), renew(A, 3));
    assert_eq!(drain(&mut m), []);
    // Rule 3: written oldest first, the first lease again.
    assert!(m.wants_to_write());
    assert_eq!(writes(&mut m), [A, B, A]);
    assert!(!m.wants_to_write());
    // Rule 4: etcd replies in order; each reply answers the oldest sent
    // renewal of its lease, whatever else is sent.
    m.handle(t0 + ms(4), reply(A, 30));
    m.handle(t0 + ms(5), reply(B, 0));
    m.handle(t0 + ms(6), reply(A, 31));
    assert_eq!(drain(&mut m), vec![ttl(1, 30), ttl(2, 0), ttl(3, 31)]);
    // A reply matching no sent renewal answers nothing.
    m.handle(t0 + ms(7), reply(A, 30));
    assert_eq!(drain(&mut m), []);
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn a_full_stream_keeps_renewals_unsent_until_it_has_room() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    m.handle(t0 + ms(10), renew(A, 2));
    m.handle(t0 + ms(11), renew(B, 3));
    // Room for one: the other stays unsent, its deadline running.
    assert_eq!(m.poll_write(), Some(A));
    assert!(m.wants_to_write());
    m.handle(t0 + ms(12), reply(B, 30));
    assert_eq!(drain(&mut m), [], "B was not written: no reply answers it");
    assert_eq!(writes(&mut m), [B]);
    m.handle(t0 + ms(13), reply(A, 30));
    m.handle(t0 + ms(14), reply(B, 30));
    assert_eq!(drain(&mut m), vec![ttl(2, 30), ttl(3, 30)]);
}

#[test]
fn a_silent_stream_is_dropped_its_renewals_fail_and_the_next_renewal_opens_another() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    let t1 = t0 + ms(100);
    m.handle(t1, renew(A, 2));
    m.handle(t1 + ms(10), renew(B, 3));
    assert_eq!(writes(&mut m), [A, B]);
    // The oldest renewal's deadline, and nothing before it.
    assert_eq!(m.poll_timeout(), Some(t1 + TIMEOUT));
    m.handle_timeout(t1 + TIMEOUT - ms(1));
    assert_eq!(drain(&mut m), []);
    // Rule 7: the oldest sent renewal is unanswered for a whole timeout:
    // the monitor is told, the stream dropped, and every sent renewal
    // fails at once (B's deadline is 10 ms later).
    m.handle_timeout(t1 + TIMEOUT);
    assert_eq!(
        drain(&mut m),
        vec![
            RenewalsCommand::Suspect,
            RenewalsCommand::Drop,
            failed(2, NO_ANSWER),
            failed(3, NO_ANSWER),
        ]
    );
    assert_eq!(m.poll_timeout(), None);
    // A late reply of the dropped stream answers nothing.
    m.handle(t1 + TIMEOUT + ms(1), reply(A, 30));
    assert_eq!(drain(&mut m), []);
    // The next renewal opens a fresh stream.
    m.handle(t1 + TIMEOUT + ms(2), renew(B, 4));
    assert_eq!(drain(&mut m), vec![open(B)]);
    m.handle(t1 + TIMEOUT + ms(3), RenewalsInput::Opened);
    assert_eq!(writes(&mut m), [B]);
    m.handle(t1 + TIMEOUT + ms(4), reply(B, 30));
    assert_eq!(drain(&mut m), vec![ttl(4, 30)]);
}

#[test]
fn renewals_late_for_a_full_stream_fail_without_dropping_it() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    let t1 = t0 + ms(100);
    m.handle(t1, renew(A, 2));
    // No room ever came: the renewal is late unsent; the stream itself
    // is not shown silent (nothing is sent on it), so it stays.
    m.handle_timeout(t1 + TIMEOUT);
    assert_eq!(
        drain(&mut m),
        vec![RenewalsCommand::Suspect, failed(2, NO_ANSWER)]
    );
    assert!(!m.wants_to_write());
    m.handle(t1 + TIMEOUT + ms(1), renew(A, 3));
    assert_eq!(drain(&mut m), [], "the stream is still open");
    assert_eq!(writes(&mut m), [A]);
}

#[test]
fn a_missing_first_lease_answers_its_renewals_ttl_zero_and_reopens_for_the_others() {
    let t0 = Instant::now();
    let mut m = Renewals::new(TIMEOUT, t0);
    m.handle(t0, renew(A, 1));
    m.handle(t0 + ms(1), renew(B, 2));
    m.handle(t0 + ms(2), renew(A, 3));
    assert_eq!(drain(&mut m), vec![open(A)]);
    // Rule 5: etcd has no A; B waits for the next stream, opened at once.
    m.handle(
        t0 + ms(10),
        RenewalsInput::OpenFailed {
            error: RpcError::LeaseNotFound,
        },
    );
    assert_eq!(drain(&mut m), vec![ttl(1, 0), ttl(3, 0), open(B)]);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(1) + TIMEOUT));
    m.handle(t0 + ms(11), RenewalsInput::Opened);
    assert_eq!(writes(&mut m), [B]);
    m.handle(t0 + ms(12), reply(B, 30));
    assert_eq!(drain(&mut m), vec![ttl(2, 30)]);
}

#[test]
fn an_open_failure_fails_every_waiting_renewal_and_opens_nothing() {
    let t0 = Instant::now();
    let mut m = Renewals::new(TIMEOUT, t0);
    m.handle(t0, renew(A, 1));
    m.handle(t0 + ms(1), renew(B, 2));
    assert_eq!(drain(&mut m), vec![open(A)]);
    // Rule 6.
    m.handle(
        t0 + ms(10),
        RenewalsInput::OpenFailed {
            error: RpcError::Unavailable("connection refused".into()),
        },
    );
    assert_eq!(
        drain(&mut m),
        vec![
            failed(1, "connection refused"),
            failed(2, "connection refused")
        ]
    );
    assert_eq!(m.poll_timeout(), None);
    // Open results of no opening are ignored.
    m.handle(t0 + ms(11), RenewalsInput::Opened);
    assert_eq!(writes(&mut m), []);
    m.handle(t0 + ms(12), renew(B, 3));
    assert_eq!(drain(&mut m), vec![open(B)]);
}

#[test]
fn renewals_waiting_for_a_stuck_opening_fail_at_their_deadlines_and_the_opening_goes() {
    let t0 = Instant::now();
    let mut m = Renewals::new(TIMEOUT, t0);
    m.handle(t0, renew(A, 1));
    m.handle(t0 + ms(10), renew(B, 2));
    assert_eq!(drain(&mut m), vec![open(A)]);
    // The first renewal's deadline is the opening's too: renewals go
    // first (rule 7: the monitor is told, 1 fails, B still waits), then
    // rule 8 gives the opening up and B fails with it.
    assert_eq!(m.poll_timeout(), Some(t0 + TIMEOUT));
    m.handle_timeout(t0 + TIMEOUT);
    assert_eq!(
        drain(&mut m),
        vec![
            RenewalsCommand::Suspect,
            failed(1, NO_ANSWER),
            RenewalsCommand::Drop,
            failed(2, NO_ANSWER),
        ]
    );
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn an_opening_nobody_waits_for_any_more_is_dropped() {
    let t0 = Instant::now();
    let mut m = Renewals::new(TIMEOUT, t0);
    m.handle(t0, renew(A, 1));
    assert_eq!(drain(&mut m), vec![open(A)]);
    m.handle_timeout(t0 + TIMEOUT);
    assert_eq!(
        drain(&mut m),
        vec![
            RenewalsCommand::Suspect,
            failed(1, NO_ANSWER),
            RenewalsCommand::Drop
        ]
    );
    assert_eq!(m.poll_timeout(), None);
    // Its late result is ignored; the next renewal opens again.
    m.handle(t0 + TIMEOUT + ms(1), RenewalsInput::Opened);
    assert_eq!(writes(&mut m), []);
    m.handle(t0 + TIMEOUT + ms(2), renew(A, 2));
    assert_eq!(drain(&mut m), vec![open(A)]);
}

#[test]
fn an_opening_past_its_deadline_fails_the_renewals_taken_since() {
    let t0 = Instant::now();
    let mut m = Renewals::new(TIMEOUT, t0);
    m.handle(t0, renew(A, 1));
    assert_eq!(drain(&mut m), vec![open(A)]);
    // Forgotten: nothing waits, yet the opening goes on (rule 10 only
    // drops renewals).
    m.handle(t0 + ms(1), RenewalsInput::Forget { lease: A });
    assert_eq!(drain(&mut m), vec![failed(1, "the lease is being revoked")]);
    m.handle(t0 + ms(2), renew(B, 2));
    assert_eq!(drain(&mut m), []);
    assert_eq!(m.poll_timeout(), Some(t0 + TIMEOUT));
    // Rule 8: B's own deadline is later; the opening's fails it now.
    m.handle_timeout(t0 + TIMEOUT);
    assert_eq!(
        drain(&mut m),
        vec![RenewalsCommand::Drop, failed(2, NO_ANSWER)]
    );
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn forget_fails_every_renewal_of_its_lease_only_and_never_writes_the_unsent() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    m.handle(t0 + ms(10), renew(A, 2));
    assert_eq!(writes(&mut m), [A]);
    m.handle(t0 + ms(11), renew(A, 3));
    m.handle(t0 + ms(12), renew(B, 4));
    m.handle(t0 + ms(13), renew(A, 5));
    // Rule 10: 2 is on the wire, answered now all the same (its reply may
    // predate the revoke); 3 and 5 were not written: failed, never sent;
    // B is another lease.
    m.handle(t0 + ms(14), RenewalsInput::Forget { lease: A });
    assert_eq!(
        drain(&mut m),
        vec![
            failed(2, "the lease is being revoked"),
            failed(3, "the lease is being revoked"),
            failed(5, "the lease is being revoked"),
        ]
    );
    assert_eq!(m.waiting(), 1);
    assert_eq!(writes(&mut m), [B]);
    // The reply etcd owed 2 is consumed in its place and answers nobody.
    m.handle(t0 + ms(15), reply(A, 30));
    m.handle(t0 + ms(16), reply(B, 30));
    assert_eq!(drain(&mut m), vec![ttl(4, 30)]);
    assert_eq!(m.waiting(), 0);
    assert_eq!(m.poll_timeout(), None);
}

/// Guarantee 6, replayed: a renewal written before its lease's revoke is
/// answered by etcd with a positive TTL, and that answer arrives after the
/// revoke (etcd-io/etcd#21638). It must reach nobody; a renewal of the
/// same lease written after the revoke gets etcd's answer to itself (TTL
/// 0), not the stale one.
#[test]
fn a_renewal_answer_that_predates_its_lease_revoke_is_never_handed_out() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    m.handle(t0 + ms(10), renew(A, 2));
    m.handle(t0 + ms(10), renew(B, 3));
    assert_eq!(writes(&mut m), [A, B]);
    // The driver is about to revoke A: forget first (the revoke follows).
    m.handle(t0 + ms(20), RenewalsInput::Forget { lease: A });
    assert_eq!(drain(&mut m), vec![failed(2, "the lease is being revoked")]);
    // A renewal of A after the revoke (another machine resuming it, say)
    // is written behind the stale one.
    m.handle(t0 + ms(30), renew(A, 4));
    assert_eq!(writes(&mut m), [A]);
    // The replies come in etcd's order: 2's (TTL 30, granted before the
    // revoke), B's, then 4's (TTL 0: the lease is gone).
    m.handle(t0 + ms(40), reply(A, 30));
    assert_eq!(drain(&mut m), [], "the stale TTL reaches nobody");
    m.handle(t0 + ms(41), reply(B, 30));
    m.handle(t0 + ms(42), reply(A, 0));
    assert_eq!(drain(&mut m), vec![ttl(3, 30), ttl(4, 0)]);
    assert_eq!(m.waiting(), 0);
}

/// A forgotten renewal has no deadline: the stream is judged silent by the
/// renewals still waiting, at their deadlines.
#[test]
fn a_forgotten_renewal_does_not_make_its_stream_silent() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    m.handle(t0 + ms(10), renew(A, 2));
    assert_eq!(writes(&mut m), [A]);
    m.handle(t0 + ms(20), RenewalsInput::Forget { lease: A });
    let _ = drain(&mut m);
    assert_eq!(m.poll_timeout(), None);
    m.handle(t0 + ms(30), renew(B, 3));
    assert_eq!(writes(&mut m), [B]);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(30) + TIMEOUT));
    // 2's own deadline (t0 + 10 ms + TIMEOUT) passes: nothing happens.
    m.handle_timeout(t0 + ms(10) + TIMEOUT);
    assert_eq!(drain(&mut m), []);
    // 3's does: the stream owes it an answer and is silent.
    m.handle_timeout(t0 + ms(30) + TIMEOUT);
    assert_eq!(
        drain(&mut m),
        vec![
            RenewalsCommand::Suspect,
            RenewalsCommand::Drop,
            failed(3, NO_ANSWER),
        ]
    );
}

#[test]
fn a_stream_that_ends_or_fails_tells_the_monitor_and_fails_every_sent_renewal() {
    for (input, why) in [
        (RenewalsInput::Ended, "renewal stream ended"),
        (
            RenewalsInput::Failed {
                error: RpcError::Unavailable("connection reset".into()),
            },
            "connection reset",
        ),
    ] {
        let t0 = Instant::now();
        let mut m = open_stream(t0);
        m.handle(t0 + ms(10), renew(A, 2));
        m.handle(t0 + ms(11), renew(B, 3));
        assert_eq!(writes(&mut m), [A, B]);
        m.handle(t0 + ms(12), renew(B, 4));
        // Rule 9: 4 is unsent, and goes to the next stream, opened at once.
        m.handle(t0 + ms(13), input);
        assert_eq!(
            drain(&mut m),
            vec![
                RenewalsCommand::Suspect,
                RenewalsCommand::Drop,
                failed(2, why),
                failed(3, why),
                open(B),
            ]
        );
        m.handle(t0 + ms(14), RenewalsInput::Opened);
        assert_eq!(writes(&mut m), [B]);
    }
}

#[test]
fn a_stream_closed_for_writes_is_dropped_without_telling_the_monitor() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    m.handle(t0 + ms(10), renew(A, 2));
    assert_eq!(writes(&mut m), [A]);
    m.handle(t0 + ms(11), renew(B, 3));
    m.handle(t0 + ms(12), RenewalsInput::Closed);
    assert_eq!(
        drain(&mut m),
        vec![
            RenewalsCommand::Drop,
            failed(2, "renewal stream closed"),
            open(B)
        ]
    );
    // Stream inputs while none is open are ignored.
    m.handle(t0 + ms(13), RenewalsInput::Ended);
    m.handle(t0 + ms(14), reply(B, 30));
    assert_eq!(drain(&mut m), []);
}

#[test]
fn stop_answers_sent_then_unsent_and_every_later_renewal_at_once() {
    let t0 = Instant::now();
    let mut m = open_stream(t0);
    m.handle(t0 + ms(10), renew(A, 2));
    assert_eq!(writes(&mut m), [A]);
    m.handle(t0 + ms(11), renew(B, 3));
    m.handle(t0 + ms(12), RenewalsInput::Stop);
    let why = "the driver is shutting down";
    assert_eq!(
        drain(&mut m),
        vec![failed(2, why), failed(3, why), RenewalsCommand::Drop]
    );
    m.handle(t0 + ms(13), renew(B, 4));
    assert_eq!(drain(&mut m), vec![failed(4, why)]);
    assert_eq!(m.poll_timeout(), None);
    assert_eq!(m.waiting(), 0);
}

#[test]
fn early_or_repeated_timeouts_do_nothing_and_deadlines_never_go_back() {
    let t0 = Instant::now();
    let mut m = Renewals::new(TIMEOUT, t0);
    m.handle(t0, renew(A, 1));
    assert_eq!(drain(&mut m), vec![open(A)]);
    m.handle_timeout(t0 + ms(1));
    m.handle_timeout(t0 + ms(1));
    assert_eq!(drain(&mut m), []);
    // A driver that comes late with an input before firing the timer sees
    // the deadline lifted to its `now`, never in the past.
    m.handle(t0 + TIMEOUT + ms(50), RenewalsInput::Forget { lease: B });
    assert_eq!(m.poll_timeout(), Some(t0 + TIMEOUT + ms(50)));
}

/// The pick of rule 12 for the `n`-th fault of a machine seeded `seed`:
/// uniform in `0..=window`, a pure function of the three.
fn pick(window: Duration, seed: u64, n: u32) -> Duration {
    let shape = BackoffConfig {
        initial: window,
        max: window,
        multiplier: 1,
        jitter_percent: 100,
    };
    Backoff::new(shape, seed).delay_for(n)
}

fn broke() -> Input {
    RenewalsInput::Failed {
        error: RpcError::Unavailable("connection reset".into()),
    }
}

/// A machine with a reopen window whose stream renewed `A` once and broke
/// at `t0 + 10 ms`.
fn broken_with_spread(t0: Instant, window: Duration, seed: u64) -> Renewals<u64> {
    let mut m = Renewals::new(TIMEOUT, t0).with_reopen_spread(window, seed);
    m.handle(t0, renew(A, 1));
    assert_eq!(
        drain(&mut m),
        vec![open(A)],
        "the first stream opens at once"
    );
    m.handle(t0 + ms(1), RenewalsInput::Opened);
    assert_eq!(writes(&mut m), [A]);
    m.handle(t0 + ms(2), reply(A, 30));
    assert_eq!(drain(&mut m), vec![ttl(1, 30)]);
    m.handle(t0 + ms(10), broke());
    assert_eq!(
        drain(&mut m),
        vec![RenewalsCommand::Suspect, RenewalsCommand::Drop]
    );
    m
}

#[test]
fn reopen_after_a_fault_waits_a_pick_from_the_window_and_every_fault_draws_anew() {
    let t0 = Instant::now();
    let window = ms(1000);
    let seed = 7;
    let first = pick(window, seed, 0);
    assert!(
        first > ms(20),
        "seed {seed} picks {first:?}: choose another"
    );
    let mut m = broken_with_spread(t0, window, seed);
    let fault = t0 + ms(10);
    // Rule 12: the next renewal waits unsent for the pick, its deadline
    // running, then the stream opens.
    m.handle(t0 + ms(20), renew(A, 2));
    assert_eq!(drain(&mut m), []);
    assert_eq!(m.waiting(), 1);
    assert_eq!(m.poll_timeout(), Some(fault + first));
    m.handle_timeout(fault + first - Duration::from_nanos(1));
    assert_eq!(drain(&mut m), []);
    m.handle_timeout(fault + first);
    assert_eq!(drain(&mut m), vec![open(A)]);
    // A refused opening is a fault too: the second pick.
    let refused = fault + first + ms(5);
    m.handle(
        refused,
        RenewalsInput::OpenFailed {
            error: RpcError::Unavailable("connection refused".into()),
        },
    );
    assert_eq!(drain(&mut m), vec![failed(2, "connection refused")]);
    let second = pick(window, seed, 1);
    assert_ne!(first, second);
    m.handle(refused, renew(A, 3));
    assert_eq!(drain(&mut m), []);
    assert_eq!(m.poll_timeout(), Some(refused + second));
    m.handle_timeout(refused + second);
    assert_eq!(drain(&mut m), vec![open(A)]);
    // etcd answering that the first lease is missing is no fault: the
    // next stream opens at once.
    let missing = refused + second + ms(1);
    m.handle(missing, renew(B, 4));
    m.handle(
        missing,
        RenewalsInput::OpenFailed {
            error: RpcError::LeaseNotFound,
        },
    );
    assert_eq!(drain(&mut m), vec![ttl(3, 0), open(B)]);
}

#[test]
fn the_reopen_window_is_at_most_a_quarter_of_the_request_timeout() {
    let t0 = Instant::now();
    let seed = 11;
    let mut m = broken_with_spread(t0, Duration::from_secs(3600), seed);
    m.handle(t0 + ms(10), renew(A, 2));
    assert_eq!(
        m.poll_timeout(),
        Some(t0 + ms(10) + pick(TIMEOUT / 4, seed, 0))
    );
    // No window at all: at once, as without a spread.
    let mut m = broken_with_spread(t0, Duration::ZERO, seed);
    m.handle(t0 + ms(20), renew(A, 2));
    assert_eq!(drain(&mut m), vec![open(A)]);
}

/// When a member restart breaks the streams of many handles at one
/// instant, each handle's keepalives retry ~75 ms later (their first
/// backoff), and without a window every handle reopens its stream in the
/// same instant. With a 500 ms window and one seed per handle the reopens
/// spread over the window: never all in the same 100 ms.
#[test]
fn handles_seeded_apart_spread_their_first_reopen_over_the_window() {
    const HANDLES: u64 = 200;
    let window = ms(500);
    let t0 = Instant::now();
    let fault = t0 + ms(10);
    let retry = fault + ms(75);
    let reopen_of = |spread: bool, seed: u64| -> Instant {
        let mut m = broken_with_spread(t0, if spread { window } else { Duration::ZERO }, seed);
        m.handle(retry, renew(A, 2));
        let mut now = retry;
        loop {
            if drain(&mut m).contains(&open(A)) {
                return now;
            }
            now = m.poll_timeout().expect("a renewal waits");
            assert!(now < fault + TIMEOUT, "no reopen before the deadline");
            m.handle_timeout(now);
        }
    };
    let herd: Vec<Instant> = (0..HANDLES).map(|seed| reopen_of(false, seed)).collect();
    assert!(
        herd.iter().all(|at| *at == retry),
        "without a window: one instant"
    );

    let mut spread: Vec<Instant> = (0..HANDLES).map(|seed| reopen_of(true, seed)).collect();
    spread.sort();
    let (first, last) = (spread[0], spread[spread.len() - 1]);
    assert!(
        first >= retry && last <= fault + window,
        "{first:?}..{last:?}"
    );
    assert!(last - first > ms(350), "spread only {:?}", last - first);
    // The busiest 100 ms holds at most a third of the handles (uniform over
    // 425 ms of the window after the retry would put ~24 % there).
    let busiest = spread
        .iter()
        .map(|from| {
            spread
                .iter()
                .filter(|at| **at >= *from && **at < *from + ms(100))
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        busiest <= (HANDLES as usize) / 3,
        "{busiest} of {HANDLES} reopen within one 100 ms"
    );
}
