//! Exhaustive bounded model checking of the machines (see
//! `fleetcoord_test_support::model`): every schedule of small worlds, with
//! faults, checked on every transition. The quick set runs here in
//! `make test`; `make model-check` runs the long set (the `#[ignore]`d
//! tests, in release).

#[path = "model/barrier.rs"]
mod barrier;

#[path = "model/election.rs"]
mod election;

#[path = "model/rwlock.rs"]
mod rwlock;

#[path = "model/stream.rs"]
mod stream;

#[path = "model/mirror.rs"]
mod mirror;

#[path = "model/keepalive.rs"]
mod keepalive;

#[path = "model/watch.rs"]
mod watch;

#[path = "model/ratelimit.rs"]
mod ratelimit;

#[path = "model/renewals.rs"]
mod renewals;

#[path = "model/session.rs"]
mod session;

#[path = "model/shard.rs"]
mod shard;
