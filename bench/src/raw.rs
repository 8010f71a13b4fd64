//! The raw anchors' client: etcd-client on a tokio runtime with one worker
//! thread (fleetcoord's driver is one thread too), driven from the
//! benchmark's plain thread with `block_on`.

use crate::Res;
use crossbeam_channel::Receiver;
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use std::future::Future;

pub struct Raw {
    rt: tokio::runtime::Runtime,
    client: Client,
}

/// A change under a watched prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEvent {
    Put(Vec<u8>),
    Delete(Vec<u8>),
}

impl Raw {
    /// One client on `endpoint` (`host:port`, or several, comma-separated).
    pub fn connect(endpoint: &str) -> Res<Raw> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        // A comma-separated list is several endpoints of one cluster.
        let endpoints: Vec<&str> = endpoint.split(',').collect();
        let client = rt.block_on(Client::connect(endpoints, None))?;
        Ok(Raw { rt, client })
    }

    /// One client on `endpoint` on a runtime of `workers` threads, for
    /// anchors that run many tasks at once.
    pub fn connect_workers(endpoint: &str, workers: usize) -> Res<Raw> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()?;
        let endpoints: Vec<&str> = endpoint.split(',').collect();
        let client = rt.block_on(Client::connect(endpoints, None))?;
        Ok(Raw { rt, client })
    }

    /// One client on `endpoint` on a current-thread runtime: every poll
    /// happens inside the caller's `block_on`, no thread hop at all — the
    /// cheapest code a plain-thread program would write instead.
    pub fn connect_on_caller(endpoint: &str) -> Res<Raw> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let endpoints: Vec<&str> = endpoint.split(',').collect();
        let client = rt.block_on(Client::connect(endpoints, None))?;
        Ok(Raw { rt, client })
    }

    /// A clone of the client (they share one connection).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The runtime the client runs on, for anchors that spawn many tasks.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.spawn(f)
    }

    /// Watches `prefix` from now on; events arrive on the returned channel
    /// from a task on the runtime. Returns once etcd has created the watch.
    pub fn watch_prefix(&self, prefix: &str) -> Res<Receiver<RawEvent>> {
        let mut client = self.client();
        let prefix = prefix.as_bytes().to_vec();
        let mut stream = self.block_on(async move {
            let mut stream = client
                .watch(prefix, Some(WatchOptions::new().with_prefix()))
                .await?;
            match stream.message().await? {
                Some(r) if r.created() => Ok::<_, etcd_client::Error>(stream),
                _ => Err(etcd_client::Error::WatchError("watch not created".into())),
            }
        })?;
        let (tx, rx) = crossbeam_channel::unbounded();
        self.spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                for e in resp.events() {
                    let Some(kv) = e.kv() else { continue };
                    let event = match e.event_type() {
                        EventType::Put => RawEvent::Put(kv.key().to_vec()),
                        EventType::Delete => RawEvent::Delete(kv.key().to_vec()),
                    };
                    if tx.send(event).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Deletes every key under `prefix`.
    pub fn delete_prefix(&self, prefix: &str) -> Res<()> {
        let mut client = self.client();
        self.block_on(client.delete(
            prefix,
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        ))?;
        Ok(())
    }

    /// How many keys are under `prefix`.
    pub fn count_prefix(&self, prefix: &str) -> Res<i64> {
        let mut client = self.client();
        let resp = self.block_on(client.get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        ))?;
        Ok(resp.count())
    }
}

/// Keeps `lease` alive every `ttl / 3` until the task is aborted, as Go's
/// clientv3 and fleetcoord do.
pub async fn keep_alive(mut client: Client, lease: i64, ttl_secs: i64) -> Res<()> {
    let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
    let every = std::time::Duration::from_millis(u64::try_from(ttl_secs)?.saturating_mul(1000) / 3);
    loop {
        keeper.keep_alive().await?;
        stream.message().await?;
        tokio::time::sleep(every).await;
    }
}
