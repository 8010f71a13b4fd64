//! fleetcoord: cross-host coordination on etcd v3 for blocking programs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
#[cfg(feature = "testing")]
pub mod testing;
mod validate;

pub use error::{Error, Result};
