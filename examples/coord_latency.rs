//! Measures Coordinator delivery latency: publish → subscriber receives,
//! kv_set → kv_watch event, and append_stream → stream reader, on the etcd
//! backend (a throwaway local etcd, or `--endpoints host:port` for a real
//! one), on the memory backend and, with the `redis` feature, on a
//! throwaway standalone Redis and a 3-master Redis Cluster.
//!
//! ```text
//! cargo run --release --example coord_latency --all-features -- [--count 2000] [--endpoints 127.0.0.1:2379]
//! ```
//!
//! Prints median, p99 and max per backend and operation. Messages are sent
//! one at a time (each waits for its delivery), so the numbers are
//! unloaded end-to-end latencies, not throughput.

use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, KvEvent, MemoryCoordinator, StreamPosition,
};
use fleetcoord::{Etcd, EtcdOptions};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut count = 2000usize;
    let mut endpoints: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--count" => count = args.next().ok_or("--count needs a number")?.parse()?,
            "--endpoints" => endpoints = Some(args.next().ok_or("--endpoints needs host:port")?),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let _server;
    let endpoint = match endpoints {
        Some(e) => e,
        None => {
            let server = fleetcoord::testing::EtcdServer::start()?;
            let e = server.endpoint();
            _server = server;
            e
        }
    };
    let etcd = Etcd::connect(&[endpoint.as_str()], EtcdOptions::default())?;
    #[allow(unused_mut)]
    let mut backends: Vec<(&str, Box<dyn Coordinator>)> = vec![
        ("etcd", Box::new(EtcdCoordinator::new(&etcd)?)),
        ("memory", Box::new(MemoryCoordinator::new())),
    ];
    #[cfg(feature = "redis")]
    let _redis = {
        use fleetcoord::coordinator::RedisCoordinator;
        use fleetcoord::testing::{RedisCluster, RedisServer};
        let server = RedisServer::start()?;
        let cluster = RedisCluster::start(3)?;
        backends.push(("redis", Box::new(RedisCoordinator::connect(&server.url())?)));
        backends.push((
            "redis-cl",
            Box::new(RedisCoordinator::connect(&cluster.urls())?),
        ));
        (server, cluster)
    };
    println!("{count} messages per row, sent one at a time");
    println!(
        "{:<8} {:<22} {:>10} {:>10} {:>10}",
        "backend", "operation", "p50", "p99", "max"
    );
    for (name, coord) in &backends {
        let pubsub = measure_pubsub(coord.as_ref(), count)?;
        report(name, "publish -> deliver", pubsub);
        let kv = measure_kv(coord.as_ref(), count)?;
        report(name, "kv_set -> watch event", kv);
        let stream = measure_stream(coord.as_ref(), count)?;
        report(name, "append -> reader", stream);
        coord.close()?;
    }
    Ok(())
}

fn measure_pubsub(
    coord: &dyn Coordinator,
    count: usize,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let sub = coord.subscribe("latency")?;
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let payload = i.to_string().into_bytes();
        let t = Instant::now();
        coord.publish("latency", &payload)?;
        loop {
            let m = sub.recv_timeout(WAIT)?;
            if m.payload == payload {
                break;
            }
        }
        samples.push(t.elapsed());
    }
    Ok(samples)
}

fn measure_kv(
    coord: &dyn Coordinator,
    count: usize,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let watch = coord.kv_watch("latency", "*")?;
    while watch.recv_timeout(WAIT)? != KvEvent::Synced {}
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let value = i.to_string().into_bytes();
        let t = Instant::now();
        coord.kv_set("latency", "k", &value)?;
        loop {
            if let KvEvent::Put { value: v, .. } = watch.recv_timeout(WAIT)? {
                if v == value {
                    break;
                }
            }
        }
        samples.push(t.elapsed());
    }
    Ok(samples)
}

fn measure_stream(
    coord: &dyn Coordinator,
    count: usize,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let reader = coord.read_stream("latency", StreamPosition::End)?;
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        let payload = i.to_string().into_bytes();
        let t = Instant::now();
        let id = coord.append_stream("latency", &payload)?;
        loop {
            let e = reader.recv_timeout(WAIT)?;
            if e.id == id {
                break;
            }
        }
        samples.push(t.elapsed());
    }
    Ok(samples)
}

fn report(backend: &str, operation: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{:<8} {:<22} {:>10.3?} {:>10.3?} {:>10.3?}",
        backend,
        operation,
        at(0.5),
        at(0.99),
        samples[samples.len() - 1]
    );
}
