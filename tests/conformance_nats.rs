//! The public conformance suite against the NATS JetStream backend on a
//! real nats-server. Every instance from the factory has its own connection
//! and driver thread (like separate processes); streams are trimmed so the
//! trimmed-resume case runs.

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
    let version = server_version();
    if version >= (2, 11) {
        report.assert_nothing_skipped();
        return;
    }
    // Before 2.11 the server cannot expire one message: exactly the TTL
    // cases report unsupported, naming the version needed and the one found.
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let cases: Vec<&str> = report.unsupported.iter().map(|(case, _)| *case).collect();
    assert_eq!(
        cases,
        [
            "kv TTL expiry seen by kv_get and by a watcher",
            "kv TTL removed by a plain set"
        ],
        "{:?}",
        report.unsupported
    );
    for (case, why) in &report.unsupported {
        assert!(
            why.contains("needs nats-server 2.11 or newer")
                && why.contains(&format!("this server is {}.{}.", version.0, version.1)),
            "{case}: {why}"
        );
    }
}

/// The major and minor version of the nats-server the tests start
/// (`$NATS_SERVER_BIN`, else `nats-server` from `PATH`, as
/// `fleetcoord::testing` picks it).
fn server_version() -> (u64, u64) {
    let bin = std::env::var_os("NATS_SERVER_BIN").unwrap_or_else(|| "nats-server".into());
    let out = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .expect("run nats-server --version");
    let text = String::from_utf8_lossy(&out.stdout);
    // "nats-server: v2.9.10"
    let version = text
        .trim()
        .rsplit('v')
        .next()
        .unwrap_or_default()
        .to_owned();
    let mut parts = version.split('.').map(|p| p.parse::<u64>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => panic!("cannot read the version in {text:?}"),
    }
}

/// A refused connect is `Error::Connect` of kind `Unavailable`, as on
/// every backend.
#[test]
fn nats_refused_connect_is_the_same_kind_as_everywhere() {
    fleetcoord::conformance::run_refused_connect(|endpoint| {
        Ok(Box::new(NatsCoordinator::connect(endpoint)?) as Box<dyn Coordinator>)
    });
}
