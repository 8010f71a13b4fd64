//! Throughput under concurrency on one coordinator handle of every
//! backend: T threads calling `kv_set`, `publish`, and `append_stream` (to
//! one stream, and spread over four), T = 1, 4, 16, each for a fixed
//! window, beside the backend's own client doing the same server work from
//! T tasks on one connection (a two-worker runtime, one per core: the
//! fastest the raw client goes here). Each operation has the cheapest raw
//! code with the same outcome as its anchor, and where that is more than
//! the plain command, the plain command beside it as the floor:
//!
//! * etcd: etcd-client `put` for `kv_set` and `publish`; for appends, the
//!   same head-guarded transaction fleetcoord runs ([`raw_appends`]), floor
//!   a put.
//! * Redis (standalone, and Cluster through redis-rs' cluster client):
//!   `kv_set` against the same one-script write (set, version bump, and a
//!   notification carrying the version, which a watcher needs; a bare `SET`
//!   notifies nobody), `publish` against `PUBLISH` (`SPUBLISH` on a
//!   cluster, fleetcoord's sharded pub/sub), appends against the same
//!   append script ([`APPEND_SCRIPT`]), floor `XADD`.
//! * NATS: `kv_set` and appends against JetStream publish with a
//!   `Nats-Msg-Id`, awaiting its ack (what a KV put and an append are),
//!   floor the same without the id; `publish` against a core publish
//!   followed by the same request fleetcoord waits for, since `flush` only
//!   writes the socket and proves nothing about delivery.
//!
//! The memory backend has no network to anchor against. Anchor and
//! fleetcoord rows of one T run back to back. Every error is counted and
//! reported in the row's label; a contended append is an error.
//! `BENCH_CONCURRENCY=redis,nats` (names: etcd, memory, redis,
//! redis-cluster, nats) runs only the backends named.

use crate::raw::Raw;
use crate::report::{Row, Side};
use crate::{BoxError, Config, Res};
use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, MemoryCoordinator, NatsCoordinator, RedisCoordinator,
};
use fleetcoord::testing::{NatsServer, RedisCluster, RedisServer};
use fleetcoord::{Etcd, EtcdOptions};
use std::rc::Rc;
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

/// The raw side of one operation: ops/s of T tasks for a window.
type RawSide = Box<dyn Fn(usize, Duration) -> Res<f64>>;

/// The operations of the figure, in row order.
const OPS: [&str; 4] = [
    "kv_set",
    "publish",
    "append_stream, 1 stream",
    "append_stream, 4 streams",
];

/// The raw code an operation is compared with: its label and its side,
/// and the plain command beneath it (the floor: cheaper than the work
/// fleetcoord does, shown beside the anchor, not compared with).
struct Anchor {
    label: &'static str,
    side: RawSide,
    floor: Option<(&'static str, RawSide)>,
}

/// One backend under test; `_keep` holds whatever must outlive it.
struct Target {
    name: &'static str,
    coord: Box<dyn Coordinator>,
    /// One anchor per entry of [`OPS`] (`None`: nothing to compare with).
    anchors: [Option<Rc<Anchor>>; 4],
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

fn runtime() -> Res<Arc<tokio::runtime::Runtime>> {
    Ok(Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
    ))
}

fn etcd_target(cfg: &Config) -> Res<Target> {
    let raw = Rc::new(Raw::connect_workers(&cfg.endpoint, 2)?);
    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    // fleetcoord's kv_set and publish are one put each; an append is one
    // head-guarded transaction, compared with the same transaction from
    // raw tasks (the put beneath it is the floor).
    let on = raw.clone();
    let put = Rc::new(Anchor {
        label: "etcd-client put",
        side: Box::new(move |t, window| raw_puts(&on, t, window)),
        floor: None,
    });
    let append = |streams: usize| {
        let (on, floor) = (raw.clone(), raw.clone());
        Some(Rc::new(Anchor {
            label: if streams == 1 {
                "etcd-client: the head-guarded append txn, 1 stream"
            } else {
                "etcd-client: the head-guarded append txn, 4 streams"
            },
            side: Box::new(move |t, window| raw_appends(&on, t, window, streams)),
            floor: Some((
                "put",
                Box::new(move |t, window| raw_puts(&floor, t, window)),
            )),
        }))
    };
    Ok(Target {
        name: "etcd",
        coord: Box::new(EtcdCoordinator::on_etcd(&etcd)?),
        anchors: [Some(put.clone()), Some(put), append(1), append(4)],
        _keep: vec![Box::new(etcd)],
    })
}

/// What an exactly-once etcd append is, written with etcd-client alone:
/// one transaction that, if the stream's head still has the mod revision
/// last seen, writes the entry under the next sequence number and bumps
/// the head; else reads the head and tries again at once. The head is
/// cached per stream in the process (as fleetcoord keeps it), so an
/// uncontended append is one round trip. Tasks on one stream race each
/// other for the head: that is the raw code's cost of the same outcome.
fn raw_appends(raw: &Raw, t: usize, window: Duration, streams: usize) -> Res<f64> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
    let client = raw.client();
    let run = std::process::id();
    // (seq, mod revision) of each stream's head, as last seen.
    let heads: Arc<Vec<std::sync::Mutex<(u64, i64)>>> = Arc::new(
        (0..streams)
            .map(|_| std::sync::Mutex::new((0, 0)))
            .collect(),
    );
    raw_tasks(raw.runtime(), t, window, move |task, _| {
        let (mut client, heads) = (client.clone(), heads.clone());
        async move {
            let n = task % streams;
            let head_key = format!("/bench/conc-raw-stream/{run}-{t}-{n}/head");
            for _ in 0..1024 {
                let (seq, rev) = *heads[n].lock().unwrap_or_else(|e| e.into_inner());
                let next = seq.saturating_add(1);
                let entry = format!("/bench/conc-raw-stream/{run}-{t}-{n}/e/{next:020}");
                let txn = Txn::new()
                    .when(vec![Compare::mod_revision(
                        head_key.as_str(),
                        CompareOp::Equal,
                        rev,
                    )])
                    .and_then(vec![
                        TxnOp::put(head_key.as_str(), next.to_string(), None),
                        TxnOp::put(entry, format!("{task}"), None),
                    ])
                    .or_else(vec![TxnOp::get(head_key.as_str(), None)]);
                let Ok(answer) = client.txn(txn).await else {
                    return false;
                };
                let mut cached = heads[n].lock().unwrap_or_else(|e| e.into_inner());
                if answer.succeeded() {
                    let at = answer.header().map_or(0, |h| h.revision());
                    if at > cached.1 {
                        *cached = (next, at);
                    }
                    return true;
                }
                for op in answer.op_responses() {
                    if let TxnOpResponse::Get(get) = op {
                        if let Some(kv) = get.kvs().first() {
                            let seq = kv.value_str().ok().and_then(|v| v.parse().ok());
                            if let Some(seq) = seq {
                                if kv.mod_revision() > cached.1 {
                                    *cached = (seq, kv.mod_revision());
                                }
                            }
                        }
                    }
                }
            }
            false
        }
    })
}

/// What fleetcoord's Redis KV write does, written with redis-rs alone: set
/// the field, bump the bucket's version and publish the change with that
/// version, all in one script. A watcher needs all three to mirror the
/// bucket without a gap, and the version must be in the message, which a
/// MULTI/EXEC cannot do (a command in it cannot use an earlier one's
/// answer); a bare `SET` would be cheaper and notify nobody.
const KV_SCRIPT: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local v = redis.call('INCR', KEYS[2])
redis.call(ARGV[3], KEYS[3], v .. ' s ' .. string.len(ARGV[1]) .. ' ' .. ARGV[1] .. ARGV[2])
return v
";

/// What fleetcoord's Redis append does, written with redis-rs alone (the
/// same script, keys and arguments): answer a repeated token with the id
/// it got, else add the entry and record the token with its id, keeping
/// the newest 4,096 tokens for 10 minutes. That record is what makes a
/// retried append store once; a bare `XADD` (the floor) keeps none.
const APPEND_SCRIPT: &str = r"
local done = redis.call('HGET', KEYS[3], ARGV[4])
if done then
  return done
end
local e = redis.call('GET', KEYS[2])
if not e then
  e = ARGV[1]
  redis.call('SET', KEYS[2], e)
end
local id = redis.call('XADD', KEYS[1], '0-*', 'e', e, 'p', ARGV[2])
redis.call('HSET', KEYS[3], ARGV[4], id)
if redis.call('RPUSH', KEYS[4], ARGV[4]) > tonumber(ARGV[5]) then
  redis.call('HDEL', KEYS[3], redis.call('LPOP', KEYS[4]))
end
redis.call('PEXPIRE', KEYS[3], ARGV[6])
redis.call('PEXPIRE', KEYS[4], ARGV[6])
return id
";

/// A redis-rs connection of either kind, cloned into every task.
#[derive(Clone)]
enum RedisConn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl RedisConn {
    async fn query(&mut self, cmd: &redis::Cmd) -> bool {
        match self {
            RedisConn::Single(c) => cmd.query_async::<redis::Value>(c).await.is_ok(),
            RedisConn::Cluster(c) => cmd.query_async::<redis::Value>(c).await.is_ok(),
        }
    }

    async fn invoke(&mut self, call: &redis::ScriptInvocation<'_>) -> bool {
        match self {
            RedisConn::Single(c) => call.invoke_async::<redis::Value>(c).await.is_ok(),
            RedisConn::Cluster(c) => call.invoke_async::<redis::Value>(c).await.is_ok(),
        }
    }
}

/// T tasks on `conn` (on `rt`), each running `op(conn, task, i)`.
fn redis_side<F, Fut>(rt: Arc<tokio::runtime::Runtime>, conn: RedisConn, op: F) -> RawSide
where
    F: Fn(RedisConn, usize, u64) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    Box::new(move |t, window| {
        let (conn, op) = (conn.clone(), op.clone());
        raw_tasks(&rt, t, window, move |task, i| op(conn.clone(), task, i))
    })
}

/// The Redis anchors on one connection: the KV script (above), `publish`
/// (`SPUBLISH` on a cluster, as fleetcoord's sharded pub/sub), and `XADD`
/// to one stream or to four.
fn redis_anchors(
    rt: Arc<tokio::runtime::Runtime>,
    conn: RedisConn,
    cluster: bool,
) -> [Option<Rc<Anchor>>; 4] {
    let publish = if cluster { "SPUBLISH" } else { "PUBLISH" };
    let kv = redis_side(
        rt.clone(),
        conn.clone(),
        move |mut conn, task, i| async move {
            let script = redis::Script::new(KV_SCRIPT);
            let mut call = script.prepare_invoke();
            call.key("bench:kv:{conc}")
                .key("bench:kvv:{conc}")
                .key("bench:kvn:{conc}")
                .arg(format!("k{task}"))
                .arg(i.to_string())
                .arg(publish);
            conn.invoke(&call).await
        },
    );
    let pubs = redis_side(
        rt.clone(),
        conn.clone(),
        move |mut conn, task, i| async move {
            let mut cmd = redis::cmd(publish);
            cmd.arg(format!("bench:topic:{{conc-{task}}}"))
                .arg(i.to_string());
            conn.query(&cmd).await
        },
    );
    let script = |streams: usize| {
        redis_side(
            rt.clone(),
            conn.clone(),
            move |mut conn, task, i| async move {
                let stream = format!("{{bench-append-{}}}", task % streams);
                let script = redis::Script::new(APPEND_SCRIPT);
                let mut call = script.prepare_invoke();
                call.key(format!("bench:stream:{stream}"))
                    .key(format!("bench:epoch:{stream}"))
                    .key(format!("bench:tokens:{stream}"))
                    .key(format!("bench:token-order:{stream}"))
                    .arg(uuid::Uuid::new_v4().simple().to_string())
                    .arg(format!("{task}-{i}"))
                    .arg("")
                    .arg(uuid::Uuid::new_v4().simple().to_string())
                    .arg(4096)
                    .arg(600_000);
                conn.invoke(&call).await
            },
        )
    };
    let xadd = |streams: usize| {
        redis_side(
            rt.clone(),
            conn.clone(),
            move |mut conn, task, i| async move {
                let mut cmd = redis::cmd("XADD");
                cmd.arg(format!("bench:stream:{{conc-{}}}", task % streams))
                    .arg("*")
                    .arg("p")
                    .arg(format!("{task}-{i}"));
                conn.query(&cmd).await
            },
        )
    };
    let (kv_label, pub_label, one_label, four_label) = if cluster {
        (
            "redis-rs cluster: the KV script",
            "redis-rs cluster SPUBLISH",
            "redis-rs cluster: the append script, 1 stream",
            "redis-rs cluster: the append script, 4 streams",
        )
    } else {
        (
            "redis-rs: the KV script",
            "redis-rs PUBLISH",
            "redis-rs: the append script, 1 stream",
            "redis-rs: the append script, 4 streams",
        )
    };
    [
        Some(Rc::new(Anchor {
            label: kv_label,
            side: kv,
            floor: None,
        })),
        Some(Rc::new(Anchor {
            label: pub_label,
            side: pubs,
            floor: None,
        })),
        Some(Rc::new(Anchor {
            label: one_label,
            side: script(1),
            floor: Some(("XADD", xadd(1))),
        })),
        Some(Rc::new(Anchor {
            label: four_label,
            side: script(4),
            floor: Some(("XADD", xadd(4))),
        })),
    ]
}

fn redis_target() -> Res<Target> {
    let server = RedisServer::start()?;
    let rt = runtime()?;
    let client = redis::Client::open(server.url())?;
    let conn = RedisConn::Single(rt.block_on(client.get_multiplexed_async_connection())?);
    Ok(Target {
        name: "redis",
        coord: Box::new(RedisCoordinator::connect(&server.url())?),
        anchors: redis_anchors(rt, conn, false),
        _keep: vec![Box::new(server)],
    })
}

fn redis_cluster_target() -> Res<Target> {
    let cluster = RedisCluster::start(3)?;
    let rt = runtime()?;
    let urls: Vec<String> = cluster.urls().split(',').map(str::to_string).collect();
    // RESP3, as fleetcoord's cluster connections (its sharded pub/sub
    // needs it).
    let client = redis::cluster::ClusterClientBuilder::new(urls)
        .use_protocol(redis::ProtocolVersion::RESP3)
        .build()?;
    let conn = RedisConn::Cluster(rt.block_on(client.get_async_connection())?);
    Ok(Target {
        name: "redis cluster (3 masters)",
        coord: Box::new(RedisCoordinator::connect(&cluster.urls())?),
        anchors: redis_anchors(rt, conn, true),
        _keep: vec![Box::new(cluster)],
    })
}

/// async-nats: JetStream publish awaiting its ack (what a KV put and a
/// stream append are) to a stream of its own, and a core publish followed
/// by the round trip fleetcoord's `publish` waits for (the server has
/// routed the message once it answers a request sent after it; `flush`
/// only writes the socket).
fn nats_target() -> Res<Target> {
    let server = NatsServer::start()?;
    let rt = runtime()?;
    let (client, context) = rt.block_on(async {
        let client = async_nats::connect(server.url()).await?;
        let context = async_nats::jetstream::new(client.clone());
        context
            .get_or_create_stream(async_nats::jetstream::stream::Config {
                name: "BENCHCONC".into(),
                subjects: vec!["benchconc.>".into()],
                ..Default::default()
            })
            .await?;
        Ok::<_, BoxError>((client, context))
    })?;
    // Every KV put and append of fleetcoord carries a `Nats-Msg-Id`, so a
    // retry is stored once; so does the anchor (the server checks it
    // against its duplicate window). A publish without one is the floor.
    let js_side = |with_id: bool| -> RawSide {
        let (js_rt, context) = (rt.clone(), context.clone());
        let ids = uuid::Uuid::new_v4().simple().to_string();
        Box::new(move |t, window| {
            let (context, ids) = (context.clone(), ids.clone());
            raw_tasks(&js_rt, t, window, move |task, i| {
                let context = context.clone();
                let mut message = async_nats::jetstream::message::PublishMessage::build()
                    .payload(i.to_string().into());
                if with_id {
                    message = message.message_id(format!("{ids}-{t}-{task}-{i:x}"));
                }
                async move {
                    match context
                        .send_publish(format!("benchconc.{task}"), message)
                        .await
                    {
                        Ok(ack) => ack.await.is_ok(),
                        Err(_) => false,
                    }
                }
            })
        })
    };
    let (js, js_floor) = (js_side(true), js_side(false));
    let core: RawSide = Box::new(move |t, window| {
        let client = client.clone();
        raw_tasks(&rt, t, window, move |task, i| {
            let client = client.clone();
            async move {
                client
                    .publish(format!("bench.topic.{task}"), i.to_string().into())
                    .await
                    .is_ok()
                    && client
                        .request(NATS_ROUND_TRIP, bytes::Bytes::new())
                        .await
                        .is_ok()
            }
        })
    });
    let js = Rc::new(Anchor {
        label: "async-nats JetStream publish with Nats-Msg-Id + ack",
        side: js,
        floor: Some(("without Nats-Msg-Id", js_floor)),
    });
    Ok(Target {
        name: "nats jetstream",
        coord: Box::new(NatsCoordinator::connect(&server.url())?),
        anchors: [
            Some(js.clone()),
            Some(Rc::new(Anchor {
                label: "async-nats publish + JetStream INFO request",
                side: core,
                floor: None,
            })),
            Some(js.clone()),
            Some(js),
        ],
        _keep: vec![Box::new(server)],
    })
}

/// The request whose answer proves the server routed what came before it:
/// the one fleetcoord's NATS backend sends (its `conn::round_trip`).
const NATS_ROUND_TRIP: &str = "$JS.API.INFO";

/// The backends `BENCH_CONCURRENCY` names (comma-separated: etcd, memory,
/// redis, redis-cluster, nats), or all of them.
fn wanted(name: &str) -> bool {
    match std::env::var("BENCH_CONCURRENCY") {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|n| n.trim() == name),
        _ => true,
    }
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let window = if cfg.quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(3)
    };
    let mut targets = Vec::new();
    if wanted("etcd") {
        targets.push(etcd_target(cfg)?);
    }
    if wanted("memory") {
        targets.push(Target {
            name: "memory",
            coord: Box::new(MemoryCoordinator::new()),
            anchors: [None, None, None, None],
            _keep: Vec::new(),
        });
    }
    if wanted("redis") {
        targets.push(redis_target()?);
    }
    if wanted("redis-cluster") {
        targets.push(redis_cluster_target()?);
    }
    if wanted("nats") {
        targets.push(nats_target()?);
    }
    let run_id = std::process::id();
    let mut rows = Vec::new();
    for target in &targets {
        let coord = target.coord.as_ref();
        let backend = target.name;
        for t in THREADS {
            // Each distinct anchor once per T, before fleetcoord's rows.
            let mut measured: Vec<(*const Anchor, f64, Option<f64>)> = Vec::new();
            for anchor in target.anchors.iter().flatten() {
                let key = Rc::as_ptr(anchor);
                if !measured.iter().any(|(k, _, _)| *k == key) {
                    let value = (anchor.side)(t, window)?;
                    let floor = match &anchor.floor {
                        Some((_, side)) => Some(side(t, window)?),
                        None => None,
                    };
                    measured.push((key, value, floor));
                }
            }
            let ops: [Op<'_>; 4] = [
                Box::new(move |thread, i| {
                    coord.kv_set("conc", &format!("k{thread}"), i.to_string().as_bytes())
                }),
                Box::new(move |thread, i| {
                    coord.publish(&format!("conc-{thread}"), i.to_string().as_bytes())
                }),
                Box::new(move |thread, i| {
                    coord
                        .append_stream(
                            &format!("conc-{run_id}-{t}-one"),
                            format!("{thread}-{i}").as_bytes(),
                        )
                        .map(|_| ())
                }),
                Box::new(move |thread, i| {
                    coord
                        .append_stream(
                            &format!("conc-{run_id}-{t}-four-{}", thread % 4),
                            format!("{thread}-{i}").as_bytes(),
                        )
                        .map(|_| ())
                }),
            ];
            for ((what, op), anchor) in OPS.iter().zip(ops.iter()).zip(&target.anchors) {
                let (ours, errors) = threads(t, window, op.as_ref());
                let anchor = anchor.as_ref().and_then(|a| {
                    let key = Rc::as_ptr(a);
                    let (_, value, floor) = measured.iter().find(|(k, _, _)| *k == key)?;
                    let floor = a
                        .floor
                        .as_ref()
                        .zip(*floor)
                        .map(|((name, _), v)| (*name, v));
                    Some((a.label, *value, floor))
                });
                eprintln!(
                    "concurrency: {backend} {what} ×{t}: {ours:.0} ops/s, {errors} errors (raw {:?}, floor {:?})",
                    anchor.map(|(_, v, _)| v.round()),
                    anchor.and_then(|(_, _, f)| f).map(|(_, v)| v.round()),
                );
                let anchor = anchor.map(|(label, value, floor)| {
                    let floor = floor
                        .map(|(name, v)| format!(" (floor, {name}: {v:.0} ops/s)"))
                        .unwrap_or_default();
                    Side::amount(
                        format!("{label}, {}{floor}", count(t, "task")),
                        value,
                        "ops/s",
                    )
                });
                rows.push(Row::new(
                    format!("{backend}: {what}, {}", count(t, "thread")),
                    Side::amount(format!("fleetcoord {what}, {errors} errors"), ours, "ops/s"),
                    anchor,
                ));
            }
        }
    }
    Ok(rows)
}

/// "1 thread", "4 threads".
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
