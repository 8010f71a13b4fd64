//! What `Etcd::connect` costs on a slow network: the probes and the shared
//! client dial and ask at once, so a connect waits for one request, as the
//! cheapest raw code does (BENCHMARKS.md, "Round trips"), with one
//! endpoint or several.

mod common;

use fleetcoord::testing::{FaultProxy, Mode};
use fleetcoord::{Etcd, EtcdOptions};
use std::time::{Duration, Instant};

/// Each way, so a round trip is twice this: long enough that a stalled
/// loopback machine cannot pass for a round trip more or less.
const ONE_WAY: Duration = Duration::from_millis(100);
const RTT: Duration = Duration::from_millis(200);

fn slow_proxy(target: &str) -> FaultProxy {
    let proxy = FaultProxy::start(target).expect("proxy");
    proxy.set_mode(Mode::Delay(ONE_WAY));
    proxy
}

/// The time `Etcd::connect` takes on `endpoints`, which must succeed.
fn connect_time(endpoints: &[String]) -> Duration {
    let started = Instant::now();
    let etcd = Etcd::with_options(endpoints, EtcdOptions::default()).expect("connect");
    let took = started.elapsed();
    etcd.close().expect("close");
    took
}

#[test]
fn a_connect_costs_the_round_trips_of_one_connection_and_one_request() {
    let server = common::start_etcd();
    let one = slow_proxy(&server.endpoint());
    let two = slow_proxy(&server.endpoint());
    for endpoints in [vec![one.endpoint()], vec![one.endpoint(), two.endpoint()]] {
        let took = connect_time(&endpoints);
        println!(
            "connect to {} endpoint(s) at RTT {RTT:?}: {took:?}",
            endpoints.len()
        );
        // One request's round trip (the proxy delays bytes, not the TCP
        // handshake) and the few milliseconds a new connection costs on
        // loopback; a request in turn would be a round trip more (before:
        // three of them).
        assert!(took >= RTT, "{took:?}");
        assert!(took < RTT + RTT / 2, "{took:?}");
    }
}
