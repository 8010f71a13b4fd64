//! Throughput under concurrency on one coordinator handle of every
//! backend: T threads calling `kv_set`, `publish`, and `append_stream` (to
//! one stream, and spread over four), T = 1, 4, 16, each for a fixed
//! window, beside the backend's own client doing one write from T tasks on
//! one connection (a two-worker runtime, one per core: the fastest the raw
//! client goes here): etcd-client `put`; redis-rs `SET` (standalone) and
//! `PUBLISH` to one node (cluster: a key-less write); async-nats JetStream
//! publish awaiting its ack (what every fleetcoord NATS write waits for).
//! The memory backend has no network to anchor against. Anchor and
//! fleetcoord rows of one T run back to back. Every error is counted and
//! reported in the row's label; a contended append is an error.

use crate::raw::Raw;
use crate::report::{Row, Side};
use crate::{BoxError, Config, Res};
use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, MemoryCoordinator, NatsCoordinator, RedisCoordinator,
};
use fleetcoord::testing::{NatsServer, RedisCluster, RedisServer};
use fleetcoord::{Etcd, EtcdOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: [usize; 3] = [1, 4, 16];

/// One operation of a row, given the thread's number and its count so far.
type Op<'a> = Box<dyn Fn(usize, u64) -> fleetcoord::Result<()> + Sync + 'a>;

/// ops/s and errors of T threads each running `op(thread, i)` for `window`.
fn threads(
    t: usize,
    window: Duration,
    op: &(dyn Fn(usize, u64) -> fleetcoord::Result<()> + Sync),
) -> (f64, u64) {
    let done = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..t {
            let (done, errors) = (&done, &errors);
            scope.spawn(move || {
                let mut i = 0u64;
                while start.elapsed() < window {
                    i += 1;
                    match op(thread, i) {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        errors.load(Ordering::Relaxed),
    )
}

/// etcd-client `put` ops/s from `t` tasks on one client for `window`.
fn raw_puts(raw: &Raw, t: usize, window: Duration) -> Res<f64> {
    let client = raw.client();
    raw_tasks(raw.runtime(), t, window, move |task, i| {
        let mut client = client.clone();
        async move {
            let key = format!("/bench/conc-raw/{task}");
            client.put(key, i.to_string(), None).await.is_ok()
        }
    })
}

/// The raw side of one backend: ops/s of T tasks for a window.
type RawSide = Box<dyn Fn(usize, Duration) -> Res<f64>>;

/// One backend under test; `_keep` holds whatever must outlive it.
struct Target {
    name: &'static str,
    coord: Box<dyn Coordinator>,
    anchor: Option<(&'static str, RawSide)>,
    _keep: Vec<Box<dyn std::any::Any>>,
}

/// ops/s of `t` tasks on `rt` each running `op(task, i)` until `window`.
fn raw_tasks<F, Fut>(rt: &tokio::runtime::Runtime, t: usize, window: Duration, op: F) -> Res<f64>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..t)
        .map(|task| {
            let (done, op) = (done.clone(), op.clone());
            rt.spawn(async move {
                let mut i = 0u64;
                while start.elapsed() < window {
                    i += 1;
                    if op(task, i).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        rt.block_on(task)?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

fn runtime() -> Res<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn etcd_target(cfg: &Config) -> Res<Target> {
    let raw = Raw::connect_workers(&cfg.endpoint, 2)?;
    let etcd = Etcd::connect(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    Ok(Target {
        name: "etcd",
        coord: Box::new(EtcdCoordinator::new(&etcd)?),
        anchor: Some((
            "etcd-client put",
            Box::new(move |t, window| raw_puts(&raw, t, window)),
        )),
        _keep: vec![Box::new(etcd)],
    })
}

/// redis-rs `SET` (or, for a cluster node, `PUBLISH`) from T tasks on one
/// multiplexed connection to `url`.
fn redis_side(url: &str, command: &'static str) -> Res<RawSide> {
    let rt = runtime()?;
    let client = redis::Client::open(url)?;
    let connection = rt.block_on(client.get_multiplexed_async_connection())?;
    Ok(Box::new(move |t, window| {
        let connection = connection.clone();
        raw_tasks(&rt, t, window, move |task, i| {
            let mut connection = connection.clone();
            async move {
                redis::cmd(command)
                    .arg(format!("bench-conc-{task}"))
                    .arg(i)
                    .query_async::<redis::Value>(&mut connection)
                    .await
                    .is_ok()
            }
        })
    }))
}

fn redis_target() -> Res<Target> {
    let server = RedisServer::start()?;
    Ok(Target {
        name: "redis",
        coord: Box::new(RedisCoordinator::connect(&server.url())?),
        anchor: Some(("redis-rs SET", redis_side(&server.url(), "SET")?)),
        _keep: vec![Box::new(server)],
    })
}

fn redis_cluster_target() -> Res<Target> {
    let cluster = RedisCluster::start(3)?;
    Ok(Target {
        name: "redis cluster (3 masters)",
        coord: Box::new(RedisCoordinator::connect(&cluster.urls())?),
        anchor: Some((
            "redis-rs PUBLISH, one node",
            redis_side(&cluster.node(0).url(), "PUBLISH")?,
        )),
        _keep: vec![Box::new(cluster)],
    })
}

/// async-nats JetStream publish, each awaiting its ack, from T tasks on
/// one connection, to a stream of its own.
fn nats_target() -> Res<Target> {
    let server = NatsServer::start()?;
    let rt = runtime()?;
    let context = rt.block_on(async {
        let client = async_nats::connect(server.url()).await?;
        let context = async_nats::jetstream::new(client);
        context
            .get_or_create_stream(async_nats::jetstream::stream::Config {
                name: "BENCHCONC".into(),
                subjects: vec!["benchconc.>".into()],
                ..Default::default()
            })
            .await?;
        Ok::<_, BoxError>(context)
    })?;
    let side: RawSide = Box::new(move |t, window| {
        let context = context.clone();
        raw_tasks(&rt, t, window, move |task, i| {
            let context = context.clone();
            async move {
                match context
                    .publish(format!("benchconc.{task}"), i.to_string().into())
                    .await
                {
                    Ok(ack) => ack.await.is_ok(),
                    Err(_) => false,
                }
            }
        })
    });
    Ok(Target {
        name: "nats jetstream",
        coord: Box::new(NatsCoordinator::connect(&server.url())?),
        anchor: Some(("async-nats JetStream publish + ack", side)),
        _keep: vec![Box::new(server)],
    })
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let window = if cfg.quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(3)
    };
    let targets = [
        etcd_target(cfg)?,
        Target {
            name: "memory",
            coord: Box::new(MemoryCoordinator::new()),
            anchor: None,
            _keep: Vec::new(),
        },
        redis_target()?,
        redis_cluster_target()?,
        nats_target()?,
    ];
    let run_id = std::process::id();
    let mut rows = Vec::new();
    for target in &targets {
        let coord = target.coord.as_ref();
        let backend = target.name;
        for t in THREADS {
            let anchor = match &target.anchor {
                Some((label, side)) => Some((*label, side(t, window)?)),
                None => None,
            };
            let ops: [(&str, Op<'_>); 4] = [
                (
                    "kv_set",
                    Box::new(move |thread, i| {
                        coord.kv_set("conc", &format!("k{thread}"), i.to_string().as_bytes())
                    }),
                ),
                (
                    "publish",
                    Box::new(move |thread, i| {
                        coord.publish(&format!("conc-{thread}"), i.to_string().as_bytes())
                    }),
                ),
                (
                    "append_stream, 1 stream",
                    Box::new(move |thread, i| {
                        coord
                            .append_stream(
                                &format!("conc-{run_id}-{t}-one"),
                                format!("{thread}-{i}").as_bytes(),
                            )
                            .map(|_| ())
                    }),
                ),
                (
                    "append_stream, 4 streams",
                    Box::new(move |thread, i| {
                        coord
                            .append_stream(
                                &format!("conc-{run_id}-{t}-four-{}", thread % 4),
                                format!("{thread}-{i}").as_bytes(),
                            )
                            .map(|_| ())
                    }),
                ),
            ];
            for (what, op) in ops.iter() {
                let (ours, errors) = threads(t, window, op.as_ref());
                eprintln!(
                    "concurrency: {backend} {what} ×{t}: {ours:.0} ops/s, {errors} errors (raw {:?})",
                    anchor.map(|(_, v)| v.round())
                );
                rows.push(Row::new(
                    format!("{backend}: {what}, {t} thread(s)"),
                    Side::amount(format!("fleetcoord {what}, {errors} errors"), ours, "ops/s"),
                    anchor
                        .map(|(label, v)| Side::amount(format!("{label}, {t} tasks"), v, "ops/s")),
                ));
            }
        }
    }
    Ok(rows)
}
