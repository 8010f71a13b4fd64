//! The public conformance suite against the in-memory backend. Every handle
//! from the factory is a clone of one hub, so cross-handle cases see each
//! other's writes; the hub trims streams so the trimmed-resume case runs.

use fleetcoord::coordinator::MemoryCoordinator;

#[test]
fn memory_backend_conforms() {
    let hub = MemoryCoordinator::with_stream_max_len(64);
    let report = fleetcoord::conformance::run(|| Box::new(hub.clone()));
    assert!(
        report.skipped.is_empty(),
        "memory declares everything: {:?}",
        report.skipped
    );
    assert!(
        report.passed.len() >= 20,
        "only {} cases ran",
        report.passed.len()
    );
}
