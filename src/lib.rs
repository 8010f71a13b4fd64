//! fleetcoord: cross-host coordination on etcd v3 for blocking programs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod coordinator;
mod driver;
pub mod election;
pub mod error;
mod etcd;
mod liveness;
mod observe;
mod pool;
#[cfg(feature = "testing")]
pub mod testing;
mod validate;
mod watcher;

pub use coordinator::conformance;
pub use election::{
    Election, ElectionOptions, LeaderInfo, LeaderObserver, Leadership, TryCampaign,
};
pub use error::{Error, Result};
pub use etcd::{Etcd, EtcdOptions};
pub use liveness::{HostLiveness, LivenessOptions, LivenessState, DEFAULT_HOSTS_PREFIX};
pub use pool::ElectionPool;
pub use watcher::{list_hosts, HostEvent, HostInfo, HostWatcher, WatcherOptions};
