//! The Redis (standalone or Cluster) backend (cargo feature `redis`). Not built yet: connecting
//! fails with [`Error::Unsupported`], so `from_env` falls back to noop
//! exactly as when the feature is off.

use crate::coordinator::{
    Coordinator, KvWatcher, StreamId, StreamPosition, StreamReader, Subscription,
};
use crate::error::{Error, Result};

/// The URL used when none is given.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// A [`Coordinator`] on Redis (standalone or Cluster).
pub struct RedisCoordinator {
    never: Never,
}

enum Never {}

impl RedisCoordinator {
    /// Connects to the comma-separated server URLs in `urls`.
    pub fn connect(urls: &str) -> Result<Self> {
        let _ = urls;
        Err(Error::Unsupported(
            "the redis backend is not implemented yet",
        ))
    }
}

impl Coordinator for RedisCoordinator {
    fn publish(&self, _: &str, _: &[u8]) -> Result<()> {
        match self.never {}
    }
    fn subscribe(&self, _: &str) -> Result<Subscription> {
        match self.never {}
    }
    fn append_stream(&self, _: &str, _: &[u8]) -> Result<StreamId> {
        match self.never {}
    }
    fn read_stream(&self, _: &str, _: StreamPosition) -> Result<StreamReader> {
        match self.never {}
    }
    fn kv_set(&self, _: &str, _: &str, _: &[u8]) -> Result<()> {
        match self.never {}
    }
    fn kv_get(&self, _: &str, _: &str) -> Result<Vec<u8>> {
        match self.never {}
    }
    fn kv_delete(&self, _: &str, _: &str) -> Result<()> {
        match self.never {}
    }
    fn kv_watch(&self, _: &str, _: &str) -> Result<KvWatcher> {
        match self.never {}
    }
    fn ping(&self) -> Result<()> {
        match self.never {}
    }
    fn close(&self) -> Result<()> {
        match self.never {}
    }
}
