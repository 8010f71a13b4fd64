//! [`StreamId`], a plain value with no dependency inside the crate, so
//! that the error type can name it (`error.rs`, an append whose outcome is
//! unknown) without importing the coordinator.

use std::fmt;

/// The ID of a stream entry: its sequence number in the stream, counting
/// from 1. Displays and parses as the plain decimal number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
