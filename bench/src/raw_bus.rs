//! Raw anchors for the non-etcd coordinator backends: the server's own
//! fastest notification path driven directly with its client crate —
//! redis-rs `PUBLISH` → an async `SUBSCRIBE` message, async-nats core
//! publish (flushed, as fleetcoord's publish is) → a subscriber message.
//! Like the etcd rows' raw put → watch event, one anchor serves every
//! operation of a backend. The client runs on a tokio runtime of one
//! worker and hands messages to the benchmark's plain thread over a
//! channel, the same hop fleetcoord's side pays.

use crate::Res;
use crossbeam_channel::Receiver;
use futures_util::StreamExt;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

/// One sample per call: publish a fresh payload, time until it arrives.
pub type Anchor = Box<dyn FnMut(usize) -> Res<Duration>>;

fn runtime() -> Res<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// Waits for `payload` on `rx`, skipping anything older.
fn wait_for(rx: &Receiver<Vec<u8>>, payload: &[u8]) -> Res<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if rx
            .recv_timeout(left)
            .map_err(|_| "no raw message within 10 s")?
            == payload
        {
            return Ok(());
        }
    }
}

/// `PUBLISH` on a multiplexed connection → the message on an async
/// `SUBSCRIBE` connection, both to the server at `url` (for a cluster, one
/// node: the message stays on it).
pub fn redis(url: &str) -> Res<Anchor> {
    let rt = runtime()?;
    let client = redis::Client::open(url)?;
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut publisher = rt.block_on(async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe("bench-raw").await?;
        tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(m) = messages.next().await {
                if tx.send(m.get_payload_bytes().to_vec()).is_err() {
                    return;
                }
            }
        });
        client.get_multiplexed_async_connection().await
    })?;
    Ok(Box::new(move |i| {
        let payload = format!("raw-{i}").into_bytes();
        let t = Instant::now();
        rt.block_on(async {
            redis::cmd("PUBLISH")
                .arg("bench-raw")
                .arg(&payload)
                .query_async::<i64>(&mut publisher)
                .await
        })?;
        wait_for(&rx, &payload)?;
        Ok(t.elapsed())
    }))
}

/// async-nats core publish and flush → the message on a subscriber of the
/// same connection.
pub fn nats(url: &str) -> Res<Anchor> {
    let rt = runtime()?;
    let (tx, rx) = crossbeam_channel::unbounded();
    let client = rt.block_on(async {
        let client = async_nats::connect(url).await?;
        let mut sub = client.subscribe("bench.raw").await?;
        client.flush().await?;
        tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                if tx.send(m.payload.to_vec()).is_err() {
                    return;
                }
            }
        });
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(client)
    })?;
    Ok(Box::new(move |i| {
        let payload = format!("raw-{i}").into_bytes();
        let t = Instant::now();
        rt.block_on(async {
            client.publish("bench.raw", payload.clone().into()).await?;
            client.flush().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })?;
        wait_for(&rx, &payload)?;
        Ok(t.elapsed())
    }))
}
