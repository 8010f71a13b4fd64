//! When to send a failed request again: one clock-injected retry policy for
//! every write the bus retries (Redis through a failover or a restart, the
//! Redis stream append, NATS deduplicated publishing and stream
//! provisioning).
//!
//! The caller makes an attempt, and on a failure tells [`Retry::on_error`]
//! what the failure says about the request ([`Sign`]); the answer is a
//! [`Decision`]: pause this long and send it again, or give up and why. The
//! async loop around it only sleeps and resends; what to repeat and when
//! to stop is decided here, where it is tested without a runtime.
//!
//! # Rules
//!
//! 1. A [`Sign::Final`] failure ends the request at once
//!    ([`GiveUp::Final`]): retrying would only repeat it.
//! 2. A [`Sign::MaybeRun`] failure puts the outcome in doubt
//!    ([`Retry::in_doubt`] stays true from then on). A request that may not
//!    be repeated ([`Repeat::Once`]) ends there ([`GiveUp::Unrepeatable`]);
//!    a repeatable one (deduplicated, idempotent) is retried like a
//!    [`Sign::NotRun`] failure.
//! 3. Every request has one deadline, `budget` after the instant it was
//!    built at; no attempt begins less than `reserve` before it, so that
//!    the last attempt has time to hear its answer ([`GiveUp::OutOfTime`]).
//! 4. The pause before the next attempt is the seeded jittered backoff of
//!    [`crate::backoff`] for the number of failures so far (reset only by a
//!    new request): a pure function of (config, seed, failures).
//! 5. A pause that would end at or after `deadline - reserve` is shortened
//!    to end there ([`LastPause::Shorten`]), or ends the request instead
//!    ([`LastPause::GiveUp`], [`GiveUp::OutOfTime`]).
//!
//! A failure reported at or after the deadline (an attempt cut off by it)
//! therefore always ends the request, after rule 2 noted the doubt it
//! leaves when the caller reports it as [`Sign::MaybeRun`].

use crate::backoff::{Backoff, BackoffConfig};
use std::time::{Duration, Instant};

/// What a failure says about the request that got it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sign {
    /// It provably did not run (a refused connection, a redirect, "not
    /// ready", "no such stream yet"): sending it again cannot apply it
    /// twice.
    NotRun,
    /// It may have run (the connection broke, no answer in time): sending it
    /// again is safe only for a repeatable request.
    MaybeRun,
    /// It will fail again (refused as invalid, not permitted, a failure no
    /// retry explains).
    Final,
}

/// Whether running a request twice is the same as running it once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// Idempotent or deduplicated by the server (a token, a message id): a
    /// request that may have run is sent again.
    Safe,
    /// Sent twice, it may take effect twice (a plain publish): retried only
    /// after failures proving it did not run.
    Once,
}

/// What rule 5 does with a pause that would end too close to the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastPause {
    /// Shorten it so that one last attempt begins `reserve` before the
    /// deadline.
    Shorten,
    /// Give up instead of pausing.
    GiveUp,
}

/// The shape of one request's retries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// How long after it was built the request ends, whatever happens.
    pub budget: Duration,
    /// Time left before the deadline in which no attempt begins.
    pub reserve: Duration,
    /// Pauses between attempts.
    pub backoff: BackoffConfig,
    /// Rule 5.
    pub last_pause: LastPause,
    /// Rule 2.
    pub repeat: Repeat,
}

/// Why a request ended without success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// Rule 1: the failure is final.
    Final,
    /// Rule 2: it may have run and may not be repeated.
    Unrepeatable,
    /// Rules 3 and 5: no time is left for another attempt.
    OutOfTime,
}

/// The answer to one failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Pause this long, then send the request again.
    Retry(Duration),
    /// Stop: the request failed.
    GiveUp(GiveUp),
}

/// The retries of one request (see the module's rules).
#[derive(Clone, Debug)]
pub struct Retry {
    config: RetryConfig,
    started: Instant,
    deadline: Instant,
    backoff: Backoff,
    failures: u32,
    in_doubt: bool,
    last_now: Instant,
}

impl Retry {
    /// The policy of a request whose first attempt begins at `now`; `seed`
    /// picks the jitter of its pauses.
    pub fn new(config: RetryConfig, now: Instant, seed: u64) -> Self {
        // A budget past what `Instant` can hold means "no deadline": a
        // century stands in for it.
        let deadline = now
            .checked_add(config.budget)
            .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
            .unwrap_or(now);
        let backoff = Backoff::new(config.backoff.clone(), seed);
        Retry {
            config,
            started: now,
            deadline,
            backoff,
            failures: 0,
            in_doubt: false,
            last_now: now,
        }
    }

    /// When the request ends at the latest: no attempt may outlive it.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The instant the request began.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Failures reported so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Whether an attempt may have run without its answer arriving (rule 2):
    /// a request that then fails has an unknown outcome.
    pub fn in_doubt(&self) -> bool {
        self.in_doubt
    }

    /// Decides what follows a failure of `sign` seen at `now` (rules 1-5).
    pub fn on_error(&mut self, now: Instant, sign: Sign) -> Decision {
        debug_assert!(now >= self.last_now, "now went backwards");
        let now = now.max(self.last_now);
        self.last_now = now;
        self.failures = self.failures.saturating_add(1);
        match sign {
            Sign::Final => return Decision::GiveUp(GiveUp::Final),
            Sign::MaybeRun => {
                self.in_doubt = true;
                if self.config.repeat == Repeat::Once {
                    return Decision::GiveUp(GiveUp::Unrepeatable);
                }
            }
            Sign::NotRun => {}
        }
        // The last instant an attempt may begin at (rule 3).
        let last_start = self
            .deadline
            .checked_sub(self.config.reserve)
            .unwrap_or(self.started);
        if now >= last_start {
            return Decision::GiveUp(GiveUp::OutOfTime);
        }
        let room = last_start - now;
        let delay = self.backoff.next_delay();
        if delay < room {
            return Decision::Retry(delay);
        }
        match self.config.last_pause {
            LastPause::Shorten => Decision::Retry(room),
            LastPause::GiveUp => Decision::GiveUp(GiveUp::OutOfTime),
        }
    }
}
