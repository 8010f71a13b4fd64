//! The public conformance suite against the etcd backend on a real etcd
//! process. Every instance from the factory has its own `Etcd` connection
//! (like separate processes) and shares the root, so cross-instance cases
//! see each other's writes; streams are trimmed so the trimmed-resume case
//! runs.

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, EtcdCoordinatorOptions};
use fleetcoord::testing::EtcdServer;
use fleetcoord::{Etcd, EtcdOptions};

#[test]
fn etcd_backend_conforms() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    let endpoint = server.endpoint();
    let report = fleetcoord::conformance::run(|| {
        let etcd = Etcd::connect(&[endpoint.as_str()], EtcdOptions::default()).expect("connect");
        let options = EtcdCoordinatorOptions::default()
            .with_root("/conformance")
            .with_stream_max_len(64);
        Box::new(EtcdCoordinator::with_options(&etcd, options).expect("coordinator"))
            as Box<dyn Coordinator>
    });
    assert!(
        report.skipped.is_empty(),
        "etcd declares everything: {:?}",
        report.skipped
    );
    assert!(
        report.passed.len() >= 20,
        "only {} cases ran",
        report.passed.len()
    );
}
