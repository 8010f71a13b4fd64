//! `kv_set_if` on every networked backend beside that backend's own
//! compare-and-set through its raw client, interleaved: etcd-client's
//! transaction on the key's mod revision; a redis-rs script that compares
//! a version and sets (standalone, and on one master of a 3-master
//! cluster, the key on its slots); async-nats' publish expecting the
//! subject's last sequence. One writer, each sample expecting the revision
//! the previous one wrote, so every sample wins: the cost of a conditional
//! write, not of contention.

use crate::raw::Raw;
use crate::report::{latency_row, Row};
use crate::stats::interleave;
use crate::{Config, Res};
use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, NatsCoordinator, RedisCoordinator};
use fleetcoord::testing::{NatsServer, RedisCluster, RedisServer};
use fleetcoord::{Etcd, EtcdOptions};
use std::time::{Duration, Instant};

/// One sample per call.
type Probe = Box<dyn FnMut(usize) -> Res<Duration>>;

/// `kv_set_if` on `coord`, each expecting the previous sample's revision.
fn ours(coord: Box<dyn Coordinator>, keep: Vec<Box<dyn std::any::Any>>) -> Res<Probe> {
    let bucket = format!("bench-cas-{}", uuid::Uuid::new_v4().simple());
    let mut revision = coord.kv_set_if(&bucket, "k", b"0", 0)?;
    Ok(Box::new(move |i| {
        let _keep = &keep;
        let t = Instant::now();
        revision = coord.kv_set_if(&bucket, "k", i.to_string().as_bytes(), revision)?;
        Ok(t.elapsed())
    }))
}

/// etcd-client: `txn(mod_revision(k) == last) then put`.
fn etcd_raw(endpoint: &str) -> Res<Probe> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let raw = Raw::connect(endpoint)?;
    let key = format!("/bench/cas-raw/{}", uuid::Uuid::new_v4().simple());
    let mut client = raw.client();
    let put = raw.block_on(client.put(key.clone(), "0", None))?;
    let mut revision = put.header().map(|h| h.revision()).ok_or("no header")?;
    Ok(Box::new(move |i| {
        let mut c = raw.client();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(key.clone(), i.to_string(), None)]);
        let t = Instant::now();
        let answer = raw.block_on(c.txn(txn))?;
        let took = t.elapsed();
        if !answer.succeeded() {
            return Err("the raw etcd compare-and-set lost, alone".into());
        }
        revision = answer.header().map(|h| h.revision()).ok_or("no header")?;
        Ok(took)
    }))
}

/// redis-rs: a script comparing the key's version and setting it, on a
/// multiplexed connection to `url`.
fn redis_raw(url: &str, key: String) -> Res<Probe> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = redis::Client::open(url)?;
    let mut conn = rt.block_on(client.get_multiplexed_async_connection())?;
    let script = redis::Script::new(
        r"
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
",
    );
    let mut version = 0u64;
    rt.block_on(async {
        redis::cmd("SET")
            .arg(&key)
            .arg("0")
            .query_async::<()>(&mut conn)
            .await
    })?;
    Ok(Box::new(move |_| {
        let next = version + 1;
        let t = Instant::now();
        let won: i64 = rt.block_on(
            script
                .key(&key)
                .arg(version)
                .arg(next)
                .invoke_async(&mut conn),
        )?;
        let took = t.elapsed();
        if won != 1 {
            return Err("the raw Redis compare-and-set lost, alone".into());
        }
        version = next;
        Ok(took)
    }))
}

/// async-nats: a JetStream publish expecting the subject's last sequence,
/// on a stream of its own.
fn nats_raw(url: &str) -> Res<Probe> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (js, mut last) = rt.block_on(async {
        let client = async_nats::connect(url).await?;
        let js = async_nats::jetstream::new(client);
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "BENCH_CAS".into(),
            subjects: vec!["benchcas.>".into()],
            max_messages_per_subject: 1,
            ..Default::default()
        })
        .await?;
        let ack = js.publish("benchcas.k", "0".into()).await?.await?;
        Ok::<_, crate::BoxError>((js, ack.sequence))
    })?;
    Ok(Box::new(move |i| {
        let message = async_nats::jetstream::message::PublishMessage::build()
            .payload(i.to_string().into())
            .expected_last_subject_sequence(last);
        let t = Instant::now();
        let ack = rt.block_on(async { js.send_publish("benchcas.k", message).await?.await })?;
        let took = t.elapsed();
        last = ack.sequence;
        Ok(took)
    }))
}

/// A key whose slot node 0 of `cluster` serves.
fn key_on_node0(cluster: &RedisCluster) -> Res<String> {
    for i in 0..1000 {
        let key = format!("bench-cas-raw-{i}");
        let slot: u16 = cluster
            .node(0)
            .command(&["CLUSTER", "KEYSLOT", &key])?
            .parse()?;
        if cluster.master_of_slot(slot) == Some(0) {
            return Ok(key);
        }
    }
    Err("no key on node 0 among 1000".into())
}

pub fn run(cfg: &Config) -> Res<Vec<Row>> {
    let n = cfg.samples(1000, 20);
    let mut rows = Vec::new();
    let mut row = |name: &str, ours: &mut Probe, what: &str, theirs: &mut Probe| -> Res<()> {
        let (a, b) = interleave(n, ours, theirs)?;
        rows.push(latency_row(
            &format!("kv_set_if {name}"),
            "kv_set_if",
            &a,
            what,
            &b,
        )?);
        Ok(())
    };

    let etcd = Etcd::with_options(&[cfg.endpoint.as_str()], EtcdOptions::default())?;
    let coord = Box::new(EtcdCoordinator::on_etcd(&etcd)?);
    row(
        "etcd",
        &mut ours(coord, vec![Box::new(etcd)])?,
        "etcd-client txn on mod revision",
        &mut etcd_raw(&cfg.endpoint)?,
    )?;

    let server = RedisServer::start()?;
    let url = server.url();
    row(
        "redis",
        &mut ours(Box::new(RedisCoordinator::connect(&url)?), Vec::new())?,
        "redis-rs compare-and-set script",
        &mut redis_raw(&url, "bench-cas-raw".into())?,
    )?;
    drop(server);

    let cluster = RedisCluster::start(3)?;
    let key = key_on_node0(&cluster)?;
    row(
        "redis cluster (3 masters)",
        &mut ours(
            Box::new(RedisCoordinator::connect(&cluster.urls())?),
            Vec::new(),
        )?,
        "redis-rs compare-and-set script, one master",
        &mut redis_raw(&cluster.node(0).url(), key)?,
    )?;
    drop(cluster);

    let server = NatsServer::start()?;
    let url = server.url();
    row(
        "nats jetstream",
        &mut ours(Box::new(NatsCoordinator::connect(&url)?), Vec::new())?,
        "async-nats publish expecting the last subject sequence",
        &mut nats_raw(&url)?,
    )?;
    drop(server);
    Ok(rows)
}
