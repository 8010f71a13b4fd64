//! Input checks shared by every public entry point. Each returns
//! `Error::InvalidArgument` naming the field, so nothing half-written ever
//! reaches etcd.

use crate::error::{Error, Result};
use fleetcoord_sm::keepalive::{trusted_lifetime, MAX_DRIFT_ALLOWANCE_PPM};
use std::time::Duration;

/// etcd rejects requests over 1.5 MiB; keep headroom for the keys and the
/// request envelope. The largest requests sent name the longest keys
/// accepted ([`MAX_KEY`] plus a [`MAX_SEGMENT`] name, about 1.3 KiB) up to
/// seven times: an election's try-campaign holds its candidate key three
/// times and its prefix four (twice with a range end), about 9 KiB. 16 KiB
/// covers that with room to spare; 4 KiB did not.
pub const MAX_PAYLOAD: usize = 1024 * 1024 + 512 * 1024 - 16 * 1024;

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

/// An election, lock or semaphore name: a single segment (see
/// [`segment`]). A `/` would make `a/b` a sub-election of `a`: its
/// candidate keys `<prefix>a/b/<lease>` lie inside the range `<prefix>a/`
/// that election `a` reads, so `a` would report, and wait for, the
/// candidates of `a/b`. The message names the rejected name and the name
/// it would nest under, never a fixed example: a user who typed
/// `foo/bar` must recognise it.
pub fn election_name(what: &'static str, value: &str) -> Result<()> {
    if value.contains('/') {
        let parent = value.split('/').next().unwrap_or_default();
        let why = if parent.is_empty() {
            format!("{value:?} contains '/': a name is one key segment")
        } else {
            format!(
                "{value:?} contains '/': a name is one key segment, since the candidates \
                 of {value:?} would also be candidates of {parent:?}"
            )
        };
        return Err(Error::invalid(what, why));
    }
    segment(what, value)
}

/// Largest capacity accepted for an event channel: the queues allocate
/// as items arrive (`feed_queue.rs`), but the capacity is what one slow
/// consumer may hold in memory, and a million pending events is far past
/// any consumer that still keeps up.
pub const MAX_CAPACITY: usize = 1 << 20;

/// The capacity of an event channel unless an option sets another: every
/// feed, host watch and observer queue starts with room for this many.
pub const DEFAULT_CAPACITY: usize = 4096;

/// The capacity of a bounded event channel: at least 2 (the half-read
/// resume rule needs room for one event while another is read), at most
/// [`MAX_CAPACITY`].
pub fn capacity(what: &'static str, value: usize) -> Result<()> {
    if !(2..=MAX_CAPACITY).contains(&value) {
        return Err(Error::invalid(
            what,
            format!("{value} is outside 2..={MAX_CAPACITY}"),
        ));
    }
    Ok(())
}

/// Shortest timeout accepted: timers count milliseconds, so anything
/// shorter would expire before the first tick (and zero means "fail before
/// trying", which nobody means).
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// Longest timeout accepted: a day is past any useful wait, and far enough
/// from `Duration::MAX` that adding slack to it never overflows.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// A timeout option: [`MIN_TIMEOUT`]..=[`MAX_TIMEOUT`].
pub fn timeout(what: &'static str, value: Duration) -> Result<()> {
    within(what, value, MIN_TIMEOUT, MAX_TIMEOUT)
}

/// `value` within `min..=max`, or an error naming `what` and the range.
pub fn within(what: &'static str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(Error::invalid(
            what,
            format!("{value:?} is outside {min:?}..={max:?}"),
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

/// A session's trust settings for a lease of `ttl` (a valid TTL): the
/// drift allowance at most [`MAX_DRIFT_ALLOWANCE_PPM`], and the safety
/// margin at most half of the TTL once shortened by the allowance (so it is
/// always below the TTL, and the keepalive keeps half of the TTL to renew
/// in: it would otherwise cut the margin down itself, see
/// [`trusted_lifetime`]).
pub fn trust(ttl: Duration, safety_margin: Duration, drift_allowance_ppm: u32) -> Result<()> {
    if drift_allowance_ppm > MAX_DRIFT_ALLOWANCE_PPM {
        return Err(Error::invalid(
            "drift_allowance_ppm",
            format!(
                "{drift_allowance_ppm} ppm is above the {MAX_DRIFT_ALLOWANCE_PPM} ppm (10 %) maximum"
            ),
        ));
    }
    let most = trusted_lifetime(ttl, Duration::ZERO, drift_allowance_ppm) / 2;
    if safety_margin > most {
        return Err(Error::invalid(
            "safety_margin",
            format!(
                "{safety_margin:?} is more than half of the {ttl:?} TTL less the drift allowance \
                 ({most:?} at most); use a longer TTL"
            ),
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
    fn election_names_are_single_segments() {
        assert!(election_name("name", "db-primary").is_ok());
        for bad in ["", "nest/sub", "/a", "a/", "a\0b"] {
            assert!(election_name("name", bad).is_err(), "{bad:?}");
        }
        // The message is about the name given, not a fixed example.
        let said = election_name("name", "foo/bar")
            .expect_err("a '/'")
            .to_string();
        assert!(
            said.contains("\"foo/bar\"") && said.contains("\"foo\""),
            "{said}"
        );
        assert!(!said.contains("\"a/b\""), "{said}");
    }

    #[test]
    fn capacity_and_timeout_bounds() {
        assert!(capacity("capacity", 2).is_ok());
        assert!(capacity("capacity", MAX_CAPACITY).is_ok());
        for bad in [0, 1, MAX_CAPACITY + 1, usize::MAX] {
            assert!(capacity("capacity", bad).is_err(), "{bad}");
        }
        assert!(timeout("t", MIN_TIMEOUT).is_ok());
        assert!(timeout("t", MAX_TIMEOUT).is_ok());
        for bad in [
            Duration::ZERO,
            Duration::from_micros(999),
            MAX_TIMEOUT + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            assert!(timeout("t", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ttl_rules() {
        assert!(ttl("ttl", Duration::from_secs(5)).is_ok());
        assert!(ttl("ttl", Duration::from_millis(500)).is_err());
        assert!(ttl("ttl", Duration::from_millis(1500)).is_err());
    }

    #[test]
    fn trust_rules() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert!(trust(s(10), ms(250), 10_000).is_ok());
        assert!(trust(s(1), ms(495), 10_000).is_ok());
        assert!(trust(s(1), Duration::ZERO, MAX_DRIFT_ALLOWANCE_PPM).is_ok());
        for (ttl, margin, ppm, field) in [
            (s(1), ms(496), 10_000, "safety_margin"),
            (s(10), s(10), 0, "safety_margin"),
            (s(10), Duration::MAX, 0, "safety_margin"),
            (
                s(10),
                ms(250),
                MAX_DRIFT_ALLOWANCE_PPM + 1,
                "drift_allowance_ppm",
            ),
            (s(10), ms(250), u32::MAX, "drift_allowance_ppm"),
        ] {
            match trust(ttl, margin, ppm) {
                Err(Error::InvalidArgument { what, .. }) if what == field => {}
                other => panic!("{ttl:?} {margin:?} {ppm}: {other:?}"),
            }
        }
    }

    #[test]
    fn payload_limit() {
        assert!(payload("payload", &vec![0; MAX_PAYLOAD]).is_ok());
        assert!(payload("payload", &vec![0; MAX_PAYLOAD + 1]).is_err());
    }
}
