//! The public conformance suite against the NATS JetStream backend on a
//! real nats-server. Every instance from the factory has its own connection
//! and driver thread (like separate processes); streams are trimmed so the
//! trimmed-resume case runs.

mod common;

use fleetcoord::coordinator::{Coordinator, NatsCoordinator, NatsOptions};
use fleetcoord::testing::NatsServer;

#[test]
fn nats_backend_follows_the_slow_consumer_contract() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats` installs it)");
    let url = server.url();
    let report = fleetcoord::conformance::run_slow_consumers(|capacity| {
        let options = NatsOptions::default().with_feed_capacity(capacity);
        Ok(Box::new(NatsCoordinator::with_options(&url, options)?) as Box<dyn Coordinator>)
    });
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.passed.len(), 4);
}

#[test]
fn nats_backend_conforms() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats` installs it)");
    let url = server.url();
    let server = std::sync::Mutex::new(server);
    let report = fleetcoord::conformance::run_with_restart(
        || {
            let options = NatsOptions::default().with_stream_max_len(64);
            Box::new(NatsCoordinator::with_options(&url, options).expect("connect"))
                as Box<dyn Coordinator>
        },
        // Same port, same store.
        || server.lock().unwrap_or_else(|p| p.into_inner()).restart(),
    );
    common::assert_nats_conforms(&report);
}

/// A refused connect is `Error::Connect` of kind `Unavailable`, as on
/// every backend.
#[test]
fn nats_refused_connect_is_the_same_kind_as_everywhere() {
    fleetcoord::conformance::run_refused_connect(|endpoint| {
        Ok(Box::new(NatsCoordinator::connect(endpoint)?) as Box<dyn Coordinator>)
    });
}
