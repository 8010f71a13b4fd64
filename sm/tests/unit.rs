//! Exact-sequence tests of each machine through its public API: concrete
//! instants, commands and notifications for hand-built cases.
//!
//! They live outside `src/` so that the crate's sources never read the
//! clock, not even in tests; here `Instant::now()` only provides a base
//! instant that every expectation is relative to.

#[path = "unit/barrier.rs"]
mod barrier;
#[path = "unit/clock.rs"]
mod clock;
#[path = "unit/election.rs"]
mod election;
#[path = "unit/election_shared.rs"]
mod election_shared;
#[path = "unit/election_support.rs"]
mod election_support;
#[path = "unit/host.rs"]
mod host;
#[path = "unit/keepalive.rs"]
mod keepalive;
#[path = "unit/mirror.rs"]
mod mirror;
#[path = "unit/newest.rs"]
mod newest;
#[path = "unit/observe.rs"]
mod observe;
#[path = "unit/outbox.rs"]
mod outbox;
#[path = "unit/plumbing.rs"]
mod plumbing;
#[path = "unit/ratelimit.rs"]
mod ratelimit;
#[path = "unit/registration.rs"]
mod registration;
#[path = "unit/renewals.rs"]
mod renewals;
#[path = "unit/retry.rs"]
mod retry;
#[path = "unit/rpc.rs"]
mod rpc;
#[path = "unit/rwlock.rs"]
mod rwlock;
#[path = "unit/semaphore.rs"]
mod semaphore;
#[path = "unit/session.rs"]
mod session;
#[path = "unit/session_hub.rs"]
mod session_hub;
#[path = "unit/shard.rs"]
mod shard;
#[path = "unit/shard_member.rs"]
mod shard_member;
#[path = "unit/stream.rs"]
mod stream;
#[path = "unit/support.rs"]
mod support;
#[path = "unit/timer.rs"]
mod timer;
#[path = "unit/watch.rs"]
mod watch;
