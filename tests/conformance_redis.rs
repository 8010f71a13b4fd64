//! The public conformance suite against the Redis backend: on a standalone
//! `redis-server` and on a 3-master Redis Cluster. Every instance from the
//! factory has its own connections (like separate processes) on the same
//! server; streams are trimmed so the trimmed-resume case runs. The servers
//! keep their data in an fsynced append-only file, so the restart hook
//! (every node killed and started again) loses nothing acknowledged.

use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{Coordinator, RedisCoordinator};
use fleetcoord::testing::{RedisCluster, RedisServer};
use std::sync::Mutex;

fn conforms(urls: &str, restart: impl Fn() -> fleetcoord::Result<()>) {
    let report = fleetcoord::conformance::run_with_restart(
        || {
            let options = RedisOptions::default().with_stream_max_len(64);
            Box::new(RedisCoordinator::with_options(urls, options).expect("connect"))
                as Box<dyn Coordinator>
        },
        restart,
    );
    report.assert_nothing_skipped();
}

#[test]
fn redis_standalone_conforms() {
    let server =
        RedisServer::start_persistent().expect("start redis-server (run `make deps-redis`)");
    let url = server.url();
    let server = Mutex::new(server);
    conforms(&url, || {
        server.lock().unwrap_or_else(|p| p.into_inner()).restart()
    });
}

#[test]
fn redis_cluster_conforms() {
    let cluster =
        RedisCluster::start_persistent(3).expect("start a redis cluster (run `make deps-redis`)");
    let urls = cluster.urls();
    let cluster = Mutex::new(cluster);
    conforms(&urls, || {
        cluster.lock().unwrap_or_else(|p| p.into_inner()).restart()
    });
}

fn slow_consumers(urls: &str) {
    let report = fleetcoord::conformance::run_slow_consumers(|capacity| {
        let options = RedisOptions::default().with_feed_capacity(capacity);
        Ok(Box::new(RedisCoordinator::with_options(urls, options)?) as Box<dyn Coordinator>)
    });
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(report.passed.len(), 4);
}

#[test]
fn redis_standalone_follows_the_slow_consumer_contract() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    slow_consumers(&server.url());
}

#[test]
fn redis_cluster_follows_the_slow_consumer_contract() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster (run `make deps-redis`)");
    slow_consumers(&cluster.urls());
}

/// A refused connect is `Error::Connect` of kind `Unavailable`, as on
/// every backend.
#[test]
fn redis_refused_connect_is_the_same_kind_as_everywhere() {
    fleetcoord::conformance::run_refused_connect(|endpoint| {
        Ok(Box::new(RedisCoordinator::connect(endpoint)?) as Box<dyn Coordinator>)
    });
}
