//! Coordinator delivery on every backend: publish → deliver, kv_set →
//! watch event, append → read, each interleaved with its backend's raw
//! anchor: etcd-client put → watch event on etcd, redis-rs PUBLISH →
//! SUBSCRIBE on Redis (a standalone server and a 3-master cluster, started
//! here), async-nats publish → subscriber on NATS (one nats-server with
//! JetStream, started here). The memory backend has no network to anchor
//! against.

use crate::raw::{Raw, RawEvent};
use crate::raw_bus::{self, Anchor};
use crate::report::{latency_row, Row, Side};
use crate::stats::interleave;
use crate::{Config, Res};
use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, KvEvent, MemoryCoordinator, NatsCoordinator, RedisCoordinator,
    StreamPosition,
};
use fleetcoord::testing::{NatsServer, RedisCluster, RedisServer};
use fleetcoord::{Etcd, EtcdOptions};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

/// One backend under test; `_keep` holds whatever must outlive it (its
/// connection, its server).
struct Backend {
    name: &'static str,
    coord: Box<dyn Coordinator>,
    /// The raw anchor and what it measures; none for memory.
    anchor: Option<(&'static str, Anchor)>,
    _keep: Vec<Box<dyn std::any::Any>>,
}

fn backends(cfg: &Config) -> Res<Vec<Backend>> {
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let coord = Box::new(EtcdCoordinator::on_etcd(&etcd)?);
    Ok(vec![
        Backend {
            name: "etcd",
            coord,
            anchor: Some(("etcd-client put → watch event", etcd_anchor(cfg)?)),
            _keep: vec![Box::new(etcd)],
        },
        Backend {
            name: "memory",
            coord: Box::new(MemoryCoordinator::new()),
            anchor: None,
            _keep: Vec::new(),
        },
        redis_standalone()?,
        redis_cluster()?,
        nats()?,
    ])
}

fn nats() -> Res<Backend> {
    let server = NatsServer::start()?;
    Ok(Backend {
        name: "nats jetstream",
        coord: Box::new(NatsCoordinator::connect(&server.url())?),
        anchor: Some((
            "async-nats publish → subscriber",
            raw_bus::nats(&server.url())?,
        )),
        _keep: vec![Box::new(server)],
    })
}

fn redis_standalone() -> Res<Backend> {
    let server = RedisServer::start()?;
    Ok(Backend {
        name: "redis",
        coord: Box::new(RedisCoordinator::connect(&server.url())?),
        anchor: Some((
            "redis-rs PUBLISH → SUBSCRIBE",
            raw_bus::redis(&server.url())?,
        )),
        _keep: vec![Box::new(server)],
    })
}

fn redis_cluster() -> Res<Backend> {
    let cluster = RedisCluster::start(3)?;
    Ok(Backend {
        name: "redis cluster (3 masters)",
        coord: Box::new(RedisCoordinator::connect(&cluster.urls())?),
        anchor: Some((
            "redis-rs PUBLISH → SUBSCRIBE, one node",
            raw_bus::redis(&cluster.node(0).url())?,
        )),
        _keep: vec![Box::new(cluster)],
    })
}

/// etcd-client put → watch event on a prefix of its own.
fn etcd_anchor(cfg: &Config) -> Res<Anchor> {
    let raw = Raw::connect(&cfg.endpoint)?;
    let raw_events = raw.watch_prefix("/bench/coord-raw/")?;
    let mut seq = 0u64;
    Ok(Box::new(move |_| {
        seq += 1;
        let key = b"/bench/coord-raw/k".to_vec();
        let mut c = raw.client();
        let t = Instant::now();
        raw.block_on(c.put(key.clone(), seq.to_string(), None))?;
        crate::liveness::wait_raw(&raw_events, &RawEvent::Put(key))?;
        Ok(t.elapsed())
    }))
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(1000, 20);
    let mut rows = Vec::new();
    for mut b in backends(cfg)? {
        let c = b.coord.as_ref();
        let probes: [(&str, Probe); 3] = [
            ("publish → deliver", pubsub(c)?),
            ("kv_set → watch event", kv(c)?),
            ("append → read", stream(c)?),
        ];
        for (op, mut probe) in probes {
            let figure = format!("coordinator {}: {op}", b.name);
            if let Some((what, anchor)) = b.anchor.as_mut() {
                let (ours, theirs) = interleave(n, &mut probe, anchor)?;
                rows.push(latency_row(&figure, op, &ours, what, &theirs)?);
            } else {
                let samples = (0..n).map(&mut probe).collect::<Res<Vec<_>>>()?;
                let side =
                    Side::latency(op, &samples).ok_or_else(|| format!("{figure}: no samples"))?;
                rows.push(Row::new(figure, side, None));
            }
        }
        b.coord.close()?;
    }
    Ok(rows)
}

/// One sample per call, on a feed opened once.
type Probe<'a> = Box<dyn FnMut(usize) -> Res<Duration> + 'a>;

fn pubsub(coord: &dyn Coordinator) -> Res<Probe<'_>> {
    let sub = coord.subscribe("bench")?;
    Ok(Box::new(move |i| {
        let payload = i.to_string().into_bytes();
        let t = Instant::now();
        coord.publish("bench", &payload)?;
        while sub.recv_timeout(WAIT)?.payload != payload {}
        Ok(t.elapsed())
    }))
}

fn kv(coord: &dyn Coordinator) -> Res<Probe<'_>> {
    let watch = coord.kv_watch("bench", "*")?;
    while watch.recv_timeout(WAIT)? != KvEvent::Synced {}
    let mut seq = 0u64;
    Ok(Box::new(move |_| {
        // A fresh value each time: setting the same one twice still
        // notifies, but a unique one cannot be mistaken for an old event.
        seq += 1;
        let value = seq.to_string().into_bytes();
        let t = Instant::now();
        coord.kv_set("bench", "k", &value)?;
        loop {
            if let KvEvent::Put { value: v, .. } = watch.recv_timeout(WAIT)? {
                if v == value {
                    return Ok(t.elapsed());
                }
            }
        }
    }))
}

fn stream(coord: &dyn Coordinator) -> Res<Probe<'_>> {
    let reader = coord.read_stream("bench", StreamPosition::End)?;
    Ok(Box::new(move |i| {
        let payload = i.to_string().into_bytes();
        let t = Instant::now();
        let id = coord.append_stream("bench", &payload)?;
        while reader.recv_timeout(WAIT)?.id != id {}
        Ok(t.elapsed())
    }))
}
