//! Deterministic simulation: every machine against a model etcd on a virtual
//! clock, with fault injection, over many seeds; invariants checked after
//! every step. See each module for the invariants it checks. The model etcd,
//! the fault harness and the world loop are the `fleetcoord-test-support`
//! crate, shared with the fuzz targets.

#[path = "sim/keepalive.rs"]
mod keepalive;

#[path = "sim/watch.rs"]
mod watch;

#[path = "sim/election.rs"]
mod election;

#[path = "sim/shard.rs"]
mod shard;

#[path = "sim/stream.rs"]
mod stream;

#[path = "sim/renewals.rs"]
mod renewals;

#[path = "sim/election_shared.rs"]
mod election_shared;
