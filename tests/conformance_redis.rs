//! The public conformance suite against the Redis backend: on a standalone
//! `redis-server` and on a 3-master Redis Cluster. Every instance from the
//! factory has its own connections (like separate processes) on the same
//! server; streams are trimmed so the trimmed-resume case runs.

use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{Coordinator, RedisCoordinator};
use fleetcoord::testing::{RedisCluster, RedisServer};

fn conforms(urls: &str) {
    let report = fleetcoord::conformance::run(|| {
        let options = RedisOptions::default().with_stream_max_len(64);
        Box::new(RedisCoordinator::with_options(urls, options).expect("connect"))
            as Box<dyn Coordinator>
    });
    assert!(
        report.skipped.is_empty(),
        "redis declares everything: {:?}",
        report.skipped
    );
    assert!(
        report.passed.len() >= 20,
        "only {} cases ran",
        report.passed.len()
    );
}

#[test]
fn redis_standalone_conforms() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    conforms(&server.url());
}

#[test]
fn redis_cluster_conforms() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster (run `make deps-redis`)");
    conforms(&cluster.urls());
}
