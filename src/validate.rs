//! Input checks shared by every public entry point. Each returns
//! `Error::InvalidArgument` naming the field, so nothing half-written ever
//! reaches etcd.

use crate::error::{Error, Result};
use std::time::Duration;

/// etcd rejects requests over 1.5 MiB; keep headroom for the key and the
/// request envelope.
pub const MAX_PAYLOAD: usize = 1024 * 1024 + 512 * 1024 - 4096;

/// Longest name segment (bucket, topic, stream, election name) accepted.
pub const MAX_SEGMENT: usize = 255;

/// Longest key accepted (etcd has no hard limit, but keys travel in every
/// watch event).
pub const MAX_KEY: usize = 1024;

/// A single path segment: non-empty, at most [`MAX_SEGMENT`] bytes, no `/`,
/// no NUL, no control characters.
pub fn segment(what: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(what, "must not be empty"));
    }
    if value.len() > MAX_SEGMENT {
        return Err(Error::invalid(
            what,
            format!(
                "is {} bytes long; at most {MAX_SEGMENT} are allowed",
                value.len()
            ),
        ));
    }
    if value.contains('/') {
        return Err(Error::invalid(
            what,
            format!("{value:?} contains '/', which separates key segments"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(
            what,
            "contains a NUL or other control character",
        ));
    }
    Ok(())
}

/// A key that may contain `/` (a KV key, an election name path): non-empty,
/// at most [`MAX_KEY`] bytes, no NUL or control characters.
pub fn key(what: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(what, "must not be empty"));
    }
    if value.len() > MAX_KEY {
        return Err(Error::invalid(
            what,
            format!(
                "is {} bytes long; at most {MAX_KEY} are allowed",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(
            what,
            "contains a NUL or other control character",
        ));
    }
    Ok(())
}

/// A key prefix such as `/coord/hosts/`: non-empty, starts with `/`, ends
/// with `/`, at most [`MAX_KEY`] bytes, no control characters.
pub fn prefix(what: &'static str, value: &str) -> Result<()> {
    key(what, value)?;
    if !value.starts_with('/') || !value.ends_with('/') {
        return Err(Error::invalid(
            what,
            format!("{value:?} must start and end with '/'"),
        ));
    }
    Ok(())
}

/// A payload or value: at most [`MAX_PAYLOAD`] bytes.
pub fn payload(what: &'static str, value: &[u8]) -> Result<()> {
    if value.len() > MAX_PAYLOAD {
        return Err(Error::invalid(
            what,
            format!(
                "is {} bytes; etcd caps requests at 1.5 MiB, so at most {MAX_PAYLOAD} bytes are accepted",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// A lease TTL: at least one second, at most one day, whole seconds.
pub fn ttl(what: &'static str, value: Duration) -> Result<()> {
    if value < Duration::from_secs(1) {
        return Err(Error::invalid(
            what,
            format!("{value:?} is below the 1 s minimum etcd leases allow"),
        ));
    }
    if value > Duration::from_secs(86_400) {
        return Err(Error::invalid(
            what,
            format!("{value:?} is above the one-day maximum"),
        ));
    }
    if value.subsec_nanos() != 0 {
        return Err(Error::invalid(
            what,
            format!("{value:?} is not a whole number of seconds; etcd leases count seconds"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_rules() {
        assert!(segment("name", "web-1").is_ok());
        for bad in ["", "a/b", "a\0b", &"x".repeat(MAX_SEGMENT + 1)] {
            match segment("name", bad) {
                Err(Error::InvalidArgument { what: "name", .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn ttl_rules() {
        assert!(ttl("ttl", Duration::from_secs(5)).is_ok());
        assert!(ttl("ttl", Duration::from_millis(500)).is_err());
        assert!(ttl("ttl", Duration::from_millis(1500)).is_err());
    }

    #[test]
    fn payload_limit() {
        assert!(payload("payload", &vec![0; MAX_PAYLOAD]).is_ok());
        assert!(payload("payload", &vec![0; MAX_PAYLOAD + 1]).is_err());
    }
}
