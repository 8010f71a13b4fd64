//! The public conformance suite against the noop backend: every case that
//! needs delivery is skipped by declaration, the rest (validation, close,
//! NotFound, unique stream ids) must pass.

use fleetcoord::coordinator::NoopCoordinator;

#[test]
fn noop_backend_conforms() {
    let report = fleetcoord::conformance::run(|| Box::new(NoopCoordinator::new()));
    assert!(!report.capabilities.delivers);
    assert!(
        !report.skipped.is_empty(),
        "noop must skip the delivery cases"
    );
    assert!(
        report.passed.len() >= 8,
        "only {} cases ran",
        report.passed.len()
    );
}

#[test]
fn noop_backend_skips_the_slow_consumer_cases_by_declaration() {
    let report = fleetcoord::conformance::run_slow_consumers(|_| {
        Ok(Box::new(NoopCoordinator::new()) as Box<dyn fleetcoord::coordinator::Coordinator>)
    });
    assert!(report.passed.is_empty());
    assert_eq!(report.skipped.len(), 4, "{:?}", report.skipped);
}
