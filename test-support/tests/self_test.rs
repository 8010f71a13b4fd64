//! The test-support crate's own tests: the model etcd, the faults, the
//! harness and the world must be right before any machine is judged by
//! them.

#[path = "self_test/fixtures.rs"]
mod fixtures;

#[path = "self_test/etcd.rs"]
mod etcd;

#[path = "self_test/faults.rs"]
mod faults;

#[path = "self_test/harness.rs"]
mod harness;

#[path = "self_test/world.rs"]
mod world;
