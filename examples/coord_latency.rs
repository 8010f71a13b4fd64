//! Measures Coordinator delivery latency: publish → subscriber receives,
//! kv_set → kv_watch event, and append_stream → stream reader, on the etcd
//! backend (a throwaway local etcd, or `--endpoints host:port` for a real
//! one), on the memory backend, with the `redis` feature on a throwaway
//! standalone Redis and a 3-master Redis Cluster, and with the `nats`
//! feature on a throwaway nats-server (or `--nats-url nats://host:port`);
//! then pub/sub throughput with one publisher and four subscribers.
//!
//! ```text
//! cargo run --release --example coord_latency --all-features -- [--count 2000] [--endpoints 127.0.0.1:2379] [--nats-url nats://127.0.0.1:4222]
//! ```
//!
//! Prints median, p99 and max per backend and operation. Messages are sent
//! one at a time (each waits for its delivery), so the numbers are
//! unloaded end-to-end latencies. The throughput rows publish back to back
//! (each `publish` still returns only once the backend has the message) and
//! count what each of the four subscriptions received.

use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, KvEvent, MemoryCoordinator, StreamPosition,
};
use fleetcoord::{Etcd, EtcdOptions};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);
const SUBSCRIBERS: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut count = 2000usize;
    let mut endpoints: Option<String> = None;
    #[allow(unused_mut)]
    let mut nats_url: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--count" => count = args.next().ok_or("--count needs a number")?.parse()?,
            "--endpoints" => endpoints = Some(args.next().ok_or("--endpoints needs host:port")?),
            "--nats-url" => nats_url = Some(args.next().ok_or("--nats-url needs a URL")?),
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
    let etcd = Etcd::with_options(&[endpoint.as_str()], EtcdOptions::default())?;
    #[allow(unused_mut)]
    let mut backends: Vec<(&str, Box<dyn Coordinator>)> = vec![
        ("etcd", Box::new(EtcdCoordinator::on_etcd(&etcd)?)),
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
    #[cfg(feature = "nats")]
    let _nats = {
        use fleetcoord::coordinator::NatsCoordinator;
        use fleetcoord::testing::NatsServer;
        let (server, url) = match nats_url.take() {
            Some(url) => (None, url),
            None => {
                let server = NatsServer::start()?;
                let url = server.url();
                (Some(server), url)
            }
        };
        backends.push(("nats", Box::new(NatsCoordinator::connect(&url)?)));
        server
    };
    #[cfg(not(feature = "nats"))]
    if nats_url.is_some() {
        return Err("--nats-url needs the `nats` feature".into());
    }
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
    }
    println!();
    println!("throughput: 1 publisher, {SUBSCRIBERS} subscribers, {count} messages");
    println!(
        "{:<8} {:>14} {:>22} {:>10}",
        "backend", "published/s", "delivered/s (all 4)", "lost"
    );
    for (name, coord) in &backends {
        let (published, delivered, lost) = measure_fanout(coord.as_ref(), count)?;
        println!("{name:<8} {published:>14.0} {delivered:>22.0} {lost:>10}");
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

/// Publishes `count` messages back to back to four subscriptions; returns
/// messages published per second, messages delivered per second (all four
/// subscriptions together, until the last one arrived or a subscription
/// stayed quiet for a second) and how many deliveries never arrived.
fn measure_fanout(
    coord: &dyn Coordinator,
    count: usize,
) -> Result<(f64, f64, usize), Box<dyn std::error::Error>> {
    let subs = (0..SUBSCRIBERS)
        .map(|_| coord.subscribe("fanout"))
        .collect::<Result<Vec<_>, _>>()?;
    let start = Instant::now();
    let received = std::thread::scope(|s| {
        let readers: Vec<_> = subs
            .iter()
            .map(|sub| {
                s.spawn(move || {
                    let mut n = 0usize;
                    while n < count && sub.recv_timeout(Duration::from_secs(1)).is_ok() {
                        n += 1;
                    }
                    (n, start.elapsed())
                })
            })
            .collect();
        let mut published = Ok(());
        for i in 0..count {
            if let Err(e) = coord.publish("fanout", &i.to_le_bytes()) {
                published = Err(e);
                break;
            }
        }
        let publish_time = start.elapsed();
        let done: Vec<(usize, Duration)> = readers
            .into_iter()
            .map(|r| r.join().unwrap_or((0, Duration::ZERO)))
            .collect();
        published.map(|()| (publish_time, done))
    });
    let (publish_time, done) = received?;
    let delivered: usize = done.iter().map(|d| d.0).sum();
    let last = done.iter().map(|d| d.1).max().unwrap_or(publish_time);
    Ok((
        count as f64 / publish_time.as_secs_f64(),
        delivered as f64 / last.as_secs_f64(),
        count * SUBSCRIBERS - delivered,
    ))
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
