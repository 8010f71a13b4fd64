//! Durations on the command line, written the way etcdctl, kubectl and
//! other Go tools take them: `500ms`, `5s`, `1m30s`, `2h`, `1.5s`.
//! Parsing is humantime's; this module adds the rules each flag needs
//! (no zero, whole seconds for lease TTLs) so that a bad value is a usage
//! error before anything connects, not a runtime error after.

use std::time::Duration;

/// Shown with every rejection, so the message alone says what to type.
const FORMS: &str = "a number and a unit, e.g. 500ms, 5s, 1m30s, 2h";

/// Any duration humantime accepts, zero included.
fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); expected {FORMS}"))
}

/// The longest timeout accepted. The library adds slack to the connect
/// timeout with plain `Duration` arithmetic, which panics near
/// `Duration::MAX`; a day is far beyond any useful wait and far from that.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// A timeout: zero would mean "fail before trying", which no one means.
pub fn timeout(text: &str) -> Result<Duration, String> {
    let value = parse(text)?;
    if value.is_zero() {
        return Err(format!("{text:?} is zero; a timeout must be longer"));
    }
    if value > MAX_TIMEOUT {
        return Err(format!("{text:?} is longer than the 24h maximum"));
    }
    Ok(value)
}

/// The longest lease TTL: the library's own maximum, checked here too so
/// that a TTL too long is a usage error (exit status 2) like every other
/// bad flag, not a runtime error after connecting.
const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// A lease TTL: etcd leases count whole seconds and last at least one, so
/// `0s`, `500ms` or `1.5s` are rejected here rather than by the library
/// after connecting, and so is anything above one day.
pub fn ttl(text: &str) -> Result<Duration, String> {
    let value = parse(text)?;
    if value > MAX_TTL {
        return Err(format!("{text:?} is longer than the 24h maximum"));
    }
    if value < Duration::from_secs(1) {
        return Err(format!(
            "{text:?} is below one second, the shortest lease etcd grants"
        ));
    }
    if value.subsec_nanos() != 0 {
        return Err(format!(
            "{text:?} is not a whole number of seconds; etcd leases count seconds"
        ));
    }
    Ok(value)
}

/// A KV key's TTL: the library's range (2 s up to 365 days, rounded up to
/// whole seconds), checked here so that a bad one is a usage error before
/// anything connects.
pub fn kv_ttl(text: &str) -> Result<Duration, String> {
    use fleetcoord::coordinator::{MAX_KV_TTL, MIN_KV_TTL};
    let value = parse(text)?;
    if value < MIN_KV_TTL || value > MAX_KV_TTL {
        return Err(format!(
            "{text:?} is outside the allowed range, {} s up to {} s (365 days)",
            MIN_KV_TTL.as_secs(),
            MAX_KV_TTL.as_secs()
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::{parse, timeout, ttl};
    use std::time::Duration;

    #[test]
    fn accepts_go_style_durations() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("5s", Duration::from_secs(5)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("2h", Duration::from_secs(7200)),
            ("1m30s", Duration::from_secs(90)),
            ("1h2m3s", Duration::from_secs(3723)),
            ("1.5s", Duration::from_millis(1500)),
            ("0s", Duration::ZERO),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_junk() {
        for bad in [
            "",
            "5",
            "s",
            "ms",
            "soon",
            "5x",
            "-1s",
            "+1s",
            "5ms5",
            "1.s",
            "99999999999999999999s",
            "18446744073709551615h",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains("not a duration"), "{bad:?}: {err}");
            assert!(err.contains("1m30s"), "{bad:?}: {err}");
            assert!(!err.contains('\n'), "{bad:?}: {err}");
        }
    }

    #[test]
    fn timeouts_are_positive() {
        assert_eq!(timeout("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(timeout("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(timeout("24h"), Ok(Duration::from_secs(86_400)));
        for bad in ["0s", "0ms", "0", "soon", "25h", "18446744073709551615s"] {
            let err = timeout(bad).expect_err(bad);
            assert!(err.contains(bad), "{bad:?}: {err}");
        }
    }

    #[test]
    fn ttls_are_whole_seconds_of_at_least_one() {
        assert_eq!(ttl("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(ttl("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(ttl("1000ms"), Ok(Duration::from_secs(1)));
        assert_eq!(ttl("24h"), Ok(Duration::from_secs(86_400)));
        for bad in [
            "0s",
            "500ms",
            "1.5s",
            "2500ms",
            "soon",
            "24h1s",
            "100000000000000h",
        ] {
            let err = ttl(bad).expect_err(bad);
            assert!(err.contains(bad), "{bad:?}: {err}");
        }
    }
}
