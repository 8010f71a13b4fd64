//! Percentiles of latency samples, and this process's CPU time and memory
//! as Linux reports them in /proc.

use crate::Res;
use std::time::Duration;

/// p50 / p90 / p99 / max of one side's samples (nearest rank).
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    /// `None` for no samples: a row without numbers is an error upstream.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        let mut sorted = samples.to_vec();
        sorted.sort();
        let max = *sorted.last()?;
        let at = |q: f64| {
            // Nearest rank: the smallest sample with at least q of the
            // samples at or below it.
            let rank = (q * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        Some(Summary {
            n: sorted.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max,
        })
    }
}

/// CPU time (user + system) this process has used so far.
pub fn cpu_time() -> Res<Duration> {
    cpu_time_of("self")
}

/// CPU time (user + system) process `pid` has used so far (`"self"` for
/// this one).
pub fn cpu_time_of(pid: &str) -> Res<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces; fields after its
    // closing parenthesis are plain numbers. utime and stime are fields 14
    // and 15, i.e. the 12th and 13th after the parenthesis.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or("unexpected /proc/self/stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Res<u64> {
        Ok(fields
            .get(i)
            .ok_or("short /proc/self/stat")?
            .parse::<u64>()?)
    };
    let total = ticks(11)?.saturating_add(ticks(12)?);
    Ok(Duration::from_nanos(
        total.saturating_mul(1_000_000_000 / clock_ticks_per_second()),
    ))
}

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux architecture this runs on
/// (USER_HZ is fixed at 100 in the kernel ABI for /proc).
fn clock_ticks_per_second() -> u64 {
    100
}

/// A `/proc/self/status` field in bytes (`VmRSS`, `VmHWM`).
pub fn status_bytes(field: &str) -> Res<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix(field).and_then(|r| r.strip_prefix(':')) {
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse()?;
            return Ok(kib.saturating_mul(1024));
        }
    }
    Err(format!("no {field} in /proc/self/status").into())
}

/// Runs `a` and `b` alternately `n` times each, swapping which goes first
/// every round (ABBA...), so that machine noise and warm-up hit both sides.
pub fn interleave(
    n: usize,
    mut a: impl FnMut(usize) -> Res<Duration>,
    mut b: impl FnMut(usize) -> Res<Duration>,
) -> Res<(Vec<Duration>, Vec<Duration>)> {
    let mut xs = Vec::with_capacity(n);
    let mut ys = Vec::with_capacity(n);
    for i in 0..n {
        if i % 2 == 0 {
            xs.push(a(i)?);
            ys.push(b(i)?);
        } else {
            ys.push(b(i)?);
            xs.push(a(i)?);
        }
    }
    Ok((xs, ys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(&ms).unwrap();
        assert_eq!(s.p50, Duration::from_millis(50));
        assert_eq!(s.p90, Duration::from_millis(90));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.max, Duration::from_millis(100));
        assert!(Summary::of(&[]).is_none());
        let one = Summary::of(&[Duration::from_millis(7)]).unwrap();
        assert_eq!(one.p50, Duration::from_millis(7));
    }

    #[test]
    fn proc_readers() {
        assert!(status_bytes("VmRSS").unwrap() > 0);
        cpu_time().unwrap();
    }
}
