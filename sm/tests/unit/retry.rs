use fleetcoord_sm::backoff::{Backoff, BackoffConfig};
use fleetcoord_sm::retry::{Decision, GiveUp, LastPause, Repeat, Retry, RetryConfig, Sign};
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 100 ms doubling to 400 ms, no jitter, so delays are exact.
fn flat(budget: u64, reserve: u64, last_pause: LastPause, repeat: Repeat) -> RetryConfig {
    RetryConfig {
        budget: ms(budget),
        reserve: ms(reserve),
        backoff: BackoffConfig {
            initial: ms(100),
            max: ms(400),
            multiplier: 2,
            jitter_percent: 0,
        },
        last_pause,
        repeat,
    }
}

#[test]
fn not_run_failures_back_off_and_the_last_pause_is_shortened_to_leave_the_reserve() {
    let t0 = Instant::now();
    let mut r = Retry::new(flat(1000, 100, LastPause::Shorten, Repeat::Once), t0, 1);
    assert_eq!(r.deadline(), t0 + ms(1000));
    // Attempts answer at once: each failure comes when its pause ended.
    let mut now = t0;
    let mut pauses = Vec::new();
    loop {
        match r.on_error(now, Sign::NotRun) {
            Decision::Retry(d) => {
                pauses.push(d);
                now += d;
            }
            Decision::GiveUp(why) => {
                assert_eq!(why, GiveUp::OutOfTime);
                break;
            }
        }
    }
    // 100, 200, 400, then 200 left before the 900 ms mark (rule 5).
    assert_eq!(pauses, vec![ms(100), ms(200), ms(400), ms(200)]);
    assert_eq!(now, t0 + ms(900));
    assert_eq!(r.failures(), 5);
    assert!(!r.in_doubt(), "nothing that may have run");
}

#[test]
fn the_give_up_variant_of_rule_5_stops_instead_of_shortening() {
    let t0 = Instant::now();
    let mut r = Retry::new(flat(1000, 0, LastPause::GiveUp, Repeat::Safe), t0, 1);
    assert_eq!(
        r.on_error(t0 + ms(10), Sign::NotRun),
        Decision::Retry(ms(100))
    );
    assert_eq!(
        r.on_error(t0 + ms(110), Sign::NotRun),
        Decision::Retry(ms(200))
    );
    assert_eq!(
        r.on_error(t0 + ms(310), Sign::NotRun),
        Decision::Retry(ms(400))
    );
    // 710 + 400 would pass the deadline.
    assert_eq!(
        r.on_error(t0 + ms(710), Sign::NotRun),
        Decision::GiveUp(GiveUp::OutOfTime)
    );
    // Ending exactly at the deadline is past it too.
    let mut r = Retry::new(flat(100, 0, LastPause::GiveUp, Repeat::Safe), t0, 1);
    assert_eq!(
        r.on_error(t0, Sign::NotRun),
        Decision::GiveUp(GiveUp::OutOfTime)
    );
}

#[test]
fn a_failure_that_may_have_run_ends_an_unrepeatable_request_and_leaves_doubt() {
    let t0 = Instant::now();
    let mut r = Retry::new(flat(1000, 100, LastPause::Shorten, Repeat::Once), t0, 1);
    assert_eq!(r.on_error(t0, Sign::NotRun), Decision::Retry(ms(100)));
    assert!(!r.in_doubt());
    assert_eq!(
        r.on_error(t0 + ms(100), Sign::MaybeRun),
        Decision::GiveUp(GiveUp::Unrepeatable)
    );
    assert!(r.in_doubt());
}

#[test]
fn a_repeatable_request_is_retried_after_a_lost_answer_but_stays_in_doubt() {
    let t0 = Instant::now();
    let mut r = Retry::new(flat(1000, 100, LastPause::Shorten, Repeat::Safe), t0, 1);
    assert_eq!(r.on_error(t0, Sign::MaybeRun), Decision::Retry(ms(100)));
    assert!(r.in_doubt());
    // A later clean refusal does not clear the doubt: the first attempt
    // may still have been applied.
    assert_eq!(
        r.on_error(t0 + ms(100), Sign::NotRun),
        Decision::Retry(ms(200))
    );
    assert!(r.in_doubt());
    // An attempt cut off by the deadline ends the request.
    assert_eq!(
        r.on_error(t0 + ms(1000), Sign::MaybeRun),
        Decision::GiveUp(GiveUp::OutOfTime)
    );
}

#[test]
fn a_final_failure_ends_the_request_whatever_the_time() {
    let t0 = Instant::now();
    let mut r = Retry::new(flat(1000, 100, LastPause::Shorten, Repeat::Safe), t0, 1);
    assert_eq!(r.on_error(t0, Sign::NotRun), Decision::Retry(ms(100)));
    assert_eq!(
        r.on_error(t0 + ms(100), Sign::Final),
        Decision::GiveUp(GiveUp::Final)
    );
    assert!(!r.in_doubt());
}

#[test]
fn pauses_are_the_seeded_backoff_and_a_pure_function_of_the_seed() {
    let t0 = Instant::now();
    let config = RetryConfig {
        backoff: BackoffConfig {
            initial: ms(20),
            max: ms(400),
            multiplier: 2,
            jitter_percent: 50,
        },
        ..flat(60_000, 100, LastPause::Shorten, Repeat::Safe)
    };
    let run = |seed| {
        let mut r = Retry::new(config.clone(), t0, seed);
        (0..8)
            .map(|n| match r.on_error(t0 + ms(n), Sign::NotRun) {
                Decision::Retry(d) => d,
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>()
    };
    let backoff = Backoff::new(config.backoff.clone(), 7);
    let expected: Vec<Duration> = (0..8).map(|n| backoff.delay_for(n)).collect();
    assert_eq!(run(7), expected);
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8), "the seed picks the jitter");
}

#[test]
fn a_budget_smaller_than_the_reserve_allows_no_retry_and_huge_budgets_do_not_overflow() {
    let t0 = Instant::now();
    let mut r = Retry::new(flat(50, 100, LastPause::Shorten, Repeat::Safe), t0, 1);
    assert_eq!(
        r.on_error(t0, Sign::NotRun),
        Decision::GiveUp(GiveUp::OutOfTime)
    );
    let mut huge = Retry::new(
        RetryConfig {
            budget: Duration::MAX,
            ..flat(0, 100, LastPause::Shorten, Repeat::Safe)
        },
        t0,
        1,
    );
    // No representable deadline: it retries as if it had none.
    assert_eq!(huge.on_error(t0, Sign::NotRun), Decision::Retry(ms(100)));
    assert!(huge.deadline() > t0 + Duration::from_secs(86_400));
}
