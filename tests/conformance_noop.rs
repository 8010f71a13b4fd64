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
