//! A fleet-wide rate limit: N processes share R permits per window, each
//! spending a share of them locally, the share tied to the process's
//! session lease.
//!
//! # Layout and what a driver feeds
//!
//! Every member holds one key `<prefix><member id>` on its session lease
//! and watches the prefix. A driver feeds [`RateShare`] the facts it
//! learns, each with the `now` it learned it at: the watch's view of the
//! member keys ([`RateShare::member_up`], [`RateShare::member_down`],
//! [`RateShare::synced`], [`RateShare::unsynced`]), and its own key's life
//! ([`RateShare::registered`] once the key is written on a lease,
//! [`RateShare::trusted`] whenever the session's local deadline moves,
//! [`RateShare::lost`] when the lease is gone). It then asks
//! [`RateShare::try_acquire`] with the *asking* thread's `now`, and before a
//! graceful leave waits for [`RateShare::release_at`]. `RateShare` is not a
//! [`crate::Machine`]: it sends no requests and keeps no timer, it answers
//! "may one permit be spent now, and if not, when to ask again", as
//! [`crate::mirror`] answers what a consumer must hear.
//!
//! # Shares
//!
//! With `n` members in the view (this one included), ordered by id, the
//! member at rank `k` (from 0) may spend
//! `share(k, n) = R / n + (1 if k < R % n else 0)` permits in any window:
//! the shares of one view add up to exactly R, and adding a member to a
//! view never raises any member's share. (Proof: let `q = R / n`,
//! `r = R % n`. If `R / (n+1) < q`, the new share is at most
//! `R / (n+1) + 1 <= q`. If `R / (n+1) = q`, the new remainder is
//! `R - q(n+1) = r - q <= r`, and a rank only grows when a member joins
//! below it, so `k' < r - q` implies `k < r`.) With more members than
//! permits, the members of rank `R` and above get none.
//!
//! # Invariants
//!
//! Kept by the code below and checked by the unit tests
//! (`tests/unit/ratelimit.rs`) and the model world
//! (`fleetcoord-test-support`, `model::ratelimit`):
//!
//! 1. **A sliding window, never more than the share.** A permit is granted
//!    at `now` only if the permits granted in `(now - W, now]` number
//!    fewer than the current share. So in any interval of length `W` a
//!    member grants at most the largest share it had during that interval.
//! 2. **Only a whole view is a share.** Nothing is granted before the
//!    first [`RateShare::synced`] or after [`RateShare::unsynced`] until
//!    the next `synced`: a share computed from half a view could be a
//!    share of too few members.
//! 3. **A joiner waits until everyone has counted it.** Nothing is granted
//!    before `joined + W + lag`, where `joined` is when this member learned
//!    its key was written (after etcd stored it) and `lag` is the
//!    configured allowance for a watch to deliver a change. The members
//!    that counted this one before it spends shrank their shares at least
//!    `W` earlier, so no window holds both a grant on their old shares
//!    and one of the joiner's (invariant 1). A new lease (after
//!    [`RateShare::lost`]) is a new join.
//! 4. **A leaving share goes back only after its last window.** A member
//!    grants at `now` only if `now + W <= until`, `until` being its
//!    session's local deadline as last told (belief by the caller's
//!    clock, as [`crate::session::SessionBelief`]): the keepalive's rule
//!    puts that deadline before etcd can expire the lease, so every grant
//!    is at least `W` older than the deletion of its key by expiry (a
//!    killed process, a partitioned one). A graceful leave deletes the key
//!    no earlier than [`RateShare::release_at`], `W` after the last grant.
//!    The others raise their shares when they see the key gone, which is
//!    then at least `W` after any grant on it: again no window holds both.
//! 5. **Faults end spending, never extend it.** [`RateShare::lost`] stops
//!    grants until a new registration; a deadline in the past, a view out
//!    of sync, or an id that is not this member's, grant nothing. Counts
//!    and instants saturate; nothing panics on any input.
//!
//! # The overshoot bound
//!
//! If every member hears of every put and delete under the prefix within
//! `lag` of etcd applying it, or stops granting first (its trust ends),
//! and clocks run at the same rate as etcd's within the session's drift
//! allowance, then in **every** interval of length `W` the fleet grants at
//! most R permits: invariants 1-4 leave no window in which a member spends
//! a share larger than the one a current, complete view gives it.
//!
//! A member cut off from etcd (a partition, a stalled watch) stops
//! hearing; it keeps granting its share of the view it last had until its
//! trust ends, at most its session's TTL after its last answered renewal
//! (minus `W`). Members that join meanwhile are not counted by it: with
//! `n` members in its view and `N` spending in fact, it grants up to
//! `ceil(R / n) - floor(R / N)` more per window than its share of `N`.
//! Leaves and expiries it misses only make it spend less than it could.
//! So the bound, stated for the whole fleet: in any window of `W`, at most
//! `R + s * ceil(R / n)` permits, where `s` is the number of members cut
//! off (for at most a TTL each) while a member joined, and `n` the
//! smallest view among them; `R` exactly when no member joins while
//! another is cut off. The real-etcd test (`tests/ratelimit.rs`) measures
//! the fleet's busiest window against it.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// The largest number of permits per window a [`RateConfig`] may have: a
/// member keeps one entry per grant in its window, so this bounds its
/// memory (24 bytes an entry).
pub const MAX_PERMITS: u32 = 1_000_000;

/// The shortest window a [`RateConfig`] may have.
pub const MIN_WINDOW: Duration = Duration::from_millis(10);

/// The longest window, and the longest lag allowance, a [`RateConfig`]
/// may have.
pub const MAX_WINDOW: Duration = Duration::from_secs(3600);

/// What a fleet-wide rate limit shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateConfig {
    /// R: permits the whole fleet may grant in any window. 1 to
    /// [`MAX_PERMITS`].
    pub permits: u32,
    /// W: the window. [`MIN_WINDOW`] to [`MAX_WINDOW`].
    pub window: Duration,
    /// How long a watch may take to deliver a membership change (see
    /// invariant 3): a joiner waits `window + lag` before it spends. 0 to
    /// [`MAX_WINDOW`].
    pub lag: Duration,
}

/// Why a [`RateConfig`] is refused: the field, and the allowed form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field.
    pub what: &'static str,
    /// What it may be.
    pub why: &'static str,
}

impl RateConfig {
    /// `Ok` when every field is in its allowed range.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.permits == 0 || self.permits > MAX_PERMITS {
            return Err(ConfigError {
                what: "permits",
                why: "must be 1 to 1,000,000 permits per window",
            });
        }
        if self.window < MIN_WINDOW || self.window > MAX_WINDOW {
            return Err(ConfigError {
                what: "window",
                why: "must be 10 ms to 1 h",
            });
        }
        if self.lag > MAX_WINDOW {
            return Err(ConfigError {
                what: "lag",
                why: "must be 0 to 1 h",
            });
        }
        Ok(())
    }
}

/// What [`RateShare::try_acquire`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// One permit granted at the `now` asked with.
    Granted,
    /// None now; ask again at this instant (a window frees a permit, or
    /// the join wait ends), or earlier on a new fact.
    At(Instant),
    /// None until a fact changes it: no whole view, no registration, no
    /// trust left, or a share of 0.
    Fact,
}

/// One member's share of a fleet-wide rate limit; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RateShare<Id> {
    config: RateConfig,
    me: Id,
    /// The members the watch says hold keys (this one too, once seen).
    view: BTreeSet<Id>,
    synced: bool,
    /// When this member learned its key was written, on the current lease.
    joined: Option<Instant>,
    /// The session's local deadline as last told.
    until: Option<Instant>,
    /// This member's grants in the current window, oldest first.
    grants: VecDeque<Instant>,
    /// The last grant ever, for [`RateShare::release_at`].
    last: Option<Instant>,
}

impl<Id: Ord + Clone> RateShare<Id> {
    /// The share of member `me` under `config`, which [`RateConfig::check`]
    /// must accept.
    pub fn new(config: RateConfig, me: Id) -> Result<Self, ConfigError> {
        config.check()?;
        Ok(RateShare {
            config,
            me,
            view: BTreeSet::new(),
            synced: false,
            joined: None,
            until: None,
            grants: VecDeque::new(),
            last: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RateConfig {
        &self.config
    }

    /// The watch says `id` holds a key.
    pub fn member_up(&mut self, id: Id) {
        self.view.insert(id);
    }

    /// The watch says `id`'s key is gone.
    pub fn member_down(&mut self, id: &Id) {
        self.view.remove(id);
    }

    /// The view is whole: everything the watch's snapshot held has been
    /// told (invariant 2).
    pub fn synced(&mut self) {
        self.synced = true;
    }

    /// The view may be missing changes (the watch stopped): nothing is
    /// granted until the next [`RateShare::synced`] (invariant 2).
    pub fn unsynced(&mut self) {
        self.synced = false;
    }

    /// This member's key was written on a new lease, and the driver learned
    /// it at `now` (invariant 3).
    pub fn registered(&mut self, now: Instant) {
        self.joined = Some(now);
    }

    /// The session's local deadline is `until` (invariant 4).
    pub fn trusted(&mut self, until: Instant) {
        self.until = Some(until);
    }

    /// No deadline is known now (the session is between states): nothing
    /// is granted until the next [`RateShare::trusted`], and the join
    /// stands (invariant 4).
    pub fn untrusted(&mut self) {
        self.until = None;
    }

    /// The lease is gone, or the member is leaving: nothing is granted
    /// until the next [`RateShare::registered`] (invariant 5).
    pub fn lost(&mut self) {
        self.joined = None;
        self.until = None;
    }

    /// How many members the view counts, this one included.
    pub fn members(&self) -> usize {
        self.view.len() + usize::from(!self.view.contains(&self.me))
    }

    /// This member's share of the permits of a window under the current
    /// view (the module docs' `share(k, n)`).
    pub fn share(&self) -> u32 {
        let rank = self.view.range(..self.me.clone()).count();
        share(self.config.permits, rank, self.members())
    }

    /// How many permits this member granted in `(now - W, now]`.
    pub fn spent(&self, now: Instant) -> usize {
        self.grants
            .iter()
            .filter(|&&at| at <= now && !expired(at, now, self.config.window))
            .count()
    }

    /// When a graceful leave may delete this member's key: `W` after its
    /// last grant (invariant 4); `None` when it never granted.
    pub fn release_at(&self) -> Option<Instant> {
        // An instant too far to add to is far enough.
        self.last
            .map(|at| at.checked_add(self.config.window).unwrap_or(at))
    }

    /// One permit at `now`, the asking thread's clock: granted if every
    /// invariant allows it, else when to ask again.
    pub fn try_acquire(&mut self, now: Instant) -> Grant {
        let window = self.config.window;
        while self
            .grants
            .front()
            .is_some_and(|&at| expired(at, now, window))
        {
            self.grants.pop_front();
        }
        let (Some(joined), Some(until)) = (self.joined, self.until) else {
            return Grant::Fact;
        };
        if !self.synced {
            return Grant::Fact;
        }
        // Invariant 4: the grant's window ends by the deadline (an end
        // past what an Instant holds does not).
        if now.checked_add(window).is_none_or(|end| end > until) {
            return Grant::Fact;
        }
        // Invariant 3.
        let Some(start) = joined.checked_add(window.saturating_add(self.config.lag)) else {
            return Grant::Fact;
        };
        if now < start {
            return Grant::At(start);
        }
        let share = self.share() as usize;
        if share == 0 {
            return Grant::Fact;
        }
        // A grant recorded later than `now` (a caller with an older clock
        // reading) still counts: `spent` would miss it, so count the queue.
        let used = self.grants.len();
        if used >= share {
            // The oldest grant that must leave the window first.
            return match self.grants.get(used - share) {
                Some(&at) => at
                    .checked_add(window)
                    .map_or(Grant::Fact, |free| Grant::At(free.max(now))),
                None => Grant::Fact,
            };
        }
        let at = self.grants.back().map_or(now, |&last| last.max(now));
        self.grants.push_back(at);
        self.last = Some(self.last.map_or(at, |last| last.max(at)));
        Grant::Granted
    }
}

/// `share(k, n)` of the module docs, for `permits` R: 0 for an empty view.
pub fn share(permits: u32, rank: usize, members: usize) -> u32 {
    let Ok(n) = u32::try_from(members) else {
        // More members than u32 counts: every share would be 0 or 1;
        // give none rather than risk one too many.
        return 0;
    };
    if n == 0 {
        return 0;
    }
    let extra = u32::from(u32::try_from(rank).is_ok_and(|k| k < permits % n));
    permits / n + extra
}

/// Whether a grant at `at` has left the window `(now - W, now]`.
fn expired(at: Instant, now: Instant, window: Duration) -> bool {
    now.checked_duration_since(at)
        .is_some_and(|age| age >= window)
}
