//! Durations on the command line: a whole number and a unit (`500ms`, `5s`,
//! `2m`, `1h`). Hand-rolled because the grammar is this small and a clear
//! message for junk matters more than breadth.

use std::time::Duration;

/// Parses `<digits><unit>` with unit `ms`, `s`, `m` or `h`. Rejects anything
/// else (missing unit, fractions, signs, spaces, overflow) with a message
/// that shows the accepted forms.
pub fn parse(text: &str) -> Result<Duration, String> {
    let junk = || {
        format!("{text:?} is not a duration: expected a whole number and a unit ms, s, m or h (e.g. 500ms, 5s, 2m)")
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(junk)?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(junk());
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is too large a duration"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(junk()),
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too large a duration"))
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::Duration;

    #[test]
    fn accepts_each_unit() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_junk() {
        for bad in [
            "",
            "5",
            "s",
            "5 s",
            " 5s",
            "5sec",
            "1.5s",
            "-1s",
            "+1s",
            "5S",
            "ms",
            "5ms5",
            "99999999999999999999s",
            "18446744073709551615h",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains("duration"), "{bad:?}: {err}");
        }
    }
}
