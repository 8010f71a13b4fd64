//! fleetcoord: cross-host coordination on etcd v3 for programs that are not
//! async — plain threads, CLIs, other runtimes.
//!
//! * [`HostLiveness`] keeps this host's key `/coord/hosts/<uuid>` alive on a
//!   short-TTL lease; lease expiry is the fleet-wide "host down" signal. The
//!   keepalive heals itself after etcd blips, restarts and pauses.
//! * [`HostWatcher`] streams [`HostEvent`]s: the existing hosts as `Up`, then
//!   `Synced`, then live `Up` / `Updated` / `Down` (with last-seen metadata
//!   and a [`DownReason`]: `Left` after a graceful close, `Expired` otherwise).
//! * [`Election`] (campaign, try_campaign, resign, proclaim, observe, fencing
//!   token, lost-leadership signal), compatible with Go's
//!   `clientv3/concurrency` and `etcdctl elect`; [`ElectionPool`] keeps one
//!   long-lived session per election name;
//!   [`Leadership::txn_if_leader`] runs [`TxnOp`]s only while etcd still
//!   has this leader.
//! * [`Mutex`] (lock, try_lock, a fenced [`MutexGuard`]): the same protocol
//!   as an election whose value nobody reads, compatible with Go's
//!   `concurrency.Mutex` and `etcdctl lock`.
//! * [`Semaphore`] (acquire, try_acquire, a fenced [`SemaphoreGuard`]): at
//!   most N holders at once, on the same protocol with N permits; a
//!   release wakes only the waiters it can let in.
//! * [`RateLimit`] (acquire, try_acquire, acquire_timeout): N processes
//!   share R permits per window, each process's share on its lease, with
//!   a documented overshoot bound during joins, leaves and partitions.
//! * [`coordinator`]: pub/sub, streams and KV with pattern watches, on etcd,
//!   in memory, or noop (and NATS or Redis behind features), with a public
//!   `conformance` suite (feature `conformance`); [`coordinator::from_env`]
//!   picks one from `COORD`, etcd when unset.
//!
//! Every connecting constructor names its servers one way:
//! `X::connect(&endpoints)` or `X::with_options(&endpoints, options)`, with
//! [`Endpoints`] a comma-separated string or a list; every failure has one
//! [`ErrorKind`] ([`Error::kind`]) whatever the backend.
//!
//! Everything is blocking and hands out crossbeam receivers. One [`Etcd`]
//! handle owns one background thread (a small tokio runtime and the single
//! etcd connection); the protocol logic lives in the deterministic,
//! fuzzed state machines of the `fleetcoord-sm` crate.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let server = fleetcoord::testing::EtcdServer::start()?;
//! # let endpoint = server.endpoint();
//! use fleetcoord::{Election, Etcd, HostEvent, HostLiveness, HostWatcher};
//! use std::time::Duration;
//!
//! let etcd = Etcd::connect(&endpoint)?;
//!
//! // Announce this host; the key disappears within the TTL if we die.
//! let me = uuid::Uuid::new_v4();
//! let liveness = HostLiveness::register(&etcd, me, br#"{"role":"db"}"#, Duration::from_secs(5))?;
//!
//! // Watch the fleet: existing hosts are replayed, then `Synced`.
//! let watcher = HostWatcher::watch(&etcd)?;
//! assert!(matches!(watcher.events().recv_timeout(Duration::from_secs(5))?, HostEvent::Up(h) if h.id == me));
//! assert_eq!(watcher.events().recv_timeout(Duration::from_secs(5))?, HostEvent::Synced);
//!
//! // Lead something; the fencing token guards writes against stale leaders.
//! let leadership = Election::new(&etcd, "scheduler")?.campaign(me.to_string().as_bytes())?;
//! assert!(leadership.is_held() && leadership.fencing_token() > 0);
//!
//! leadership.resign()?;
//! liveness.close()?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
// docs.rs (Cargo.toml, [package.metadata.docs.rs]) sets `docsrs`: each
// feature-gated item then shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod barrier;
mod blocking;
mod caller_driven;
pub mod coordinator;
mod deadline;
mod driver;
pub mod election;
mod endpoint;
mod endpoints;
pub mod error;
mod etcd;
mod feed_queue;
mod liveness;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod ratelimit;
mod resume;
mod runtime;
mod server_version;
mod session;
mod shard;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod tls;
mod txn;
mod validate;
mod watcher;

pub use barrier::{DoubleBarrier, DEFAULT_BARRIER_PREFIX, MAX_BARRIER_COUNT};
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub use coordinator::conformance;
pub use election::mutex::{Mutex, MutexGuard, DEFAULT_LOCK_PREFIX};
pub use election::rwlock::{RwLock, RwLockGuard, RwMode, DEFAULT_RWLOCK_PREFIX};
pub use election::semaphore::{Semaphore, SemaphoreGuard, DEFAULT_SEMAPHORE_PREFIX};
pub use election::{
    Canceller, Election, ElectionOptions, ElectionPool, LeaderInfo, LeaderObserver, Leadership,
    LockOptions, Pending, TryCampaign,
};
pub use endpoints::Endpoints;
pub use error::{Error, ErrorKind, Result};
pub use etcd::{Etcd, EtcdOptions, LeaseTtl};
pub use liveness::{HostLiveness, LivenessOptions, DEFAULT_HOSTS_PREFIX};
pub use ratelimit::{Permit, RateLimit, RateLimitOptions, DEFAULT_RATELIMIT_PREFIX};
pub use resume::{HostResume, Resume, SessionResume};
pub use server_version::{etcd_defects, KnownDefect, ServerVersion};
pub use session::{LivenessState, Session, SessionOptions};
pub use shard::{
    ShardEvent, ShardMap, ShardMember, ShardOptions, ShardOwner, DEFAULT_SHARDS_PREFIX, MAX_SHARDS,
};
pub use tls::{EtcdUser, Tls};
pub use txn::{KeyValue, TxnOp, TxnOpResponse};
pub use watcher::{list_hosts, DownReason, HostEvent, HostInfo, HostWatcher, WatcherOptions};

// The README's Rust blocks run as doc tests, so they cannot drift from the
// API they show. Only compiled for `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctests {}
