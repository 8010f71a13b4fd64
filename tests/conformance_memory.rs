//! The public conformance suite against the in-memory backend. Every handle
//! from the factory is a clone of one hub, so cross-handle cases see each
//! other's writes; the hub trims streams so the trimmed-resume case runs.

use fleetcoord::coordinator::{Coordinator, MemoryCoordinator, MemoryOptions};
use std::collections::HashMap;
use std::sync::Mutex;

#[test]
fn memory_backend_conforms() {
    let hub = MemoryCoordinator::with_options(MemoryOptions::default().with_stream_max_len(64))
        .expect("options within the bounds");
    let report = fleetcoord::conformance::run(|| Box::new(hub.clone()));
    report.assert_nothing_skipped();
}

#[test]
fn memory_backend_follows_the_slow_consumer_contract() {
    // One hub per capacity, so handles of one capacity share their store.
    let hubs: Mutex<HashMap<usize, MemoryCoordinator>> = Mutex::new(HashMap::new());
    let report = fleetcoord::conformance::run_slow_consumers(|capacity| {
        let mut hubs = hubs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hub) = hubs.get(&capacity) {
            return Ok(Box::new(hub.clone()) as Box<dyn Coordinator>);
        }
        let hub =
            MemoryCoordinator::with_options(MemoryOptions::default().with_feed_capacity(capacity))?;
        hubs.insert(capacity, hub.clone());
        Ok(Box::new(hub))
    });
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.passed.len(), 4);
}
