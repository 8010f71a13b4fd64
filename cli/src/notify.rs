//! The service manager's readiness protocol (systemd `Type=notify`,
//! `sd_notify(3)`): one datagram of `KEY=value` lines to the Unix socket
//! named by `NOTIFY_SOCKET` (a path, or `@name` for the abstract
//! namespace). Without the variable nothing is sent; a send that fails is
//! ignored, as `sd_notify` does: the service must not die of it.
//!
//! What the long-running commands say (through [`crate::metrics_http::Health`],
//! which they already flip as their state changes):
//! * `READY=1` the first time the command is healthy: `agent` registered,
//!   `elect` leading, `lock` holding, `watch-hosts` synced. A unit that
//!   orders `After=` this one starts once the host is live or the leader
//!   is in place;
//! * `STATUS=…` at every change, shown by `systemctl status`;
//! * `STOPPING=1` when the command stops;
//! * `WATCHDOG=1` each time the lease is renewed (`agent`: the host's lease,
//!   `elect`/`lock`: the session's, waiting or holding), when the unit has
//!   a watchdog (`WatchdogSec=`, which sets `WATCHDOG_USEC`). A process
//!   that stops renewing, wedged or cut off from etcd, is restarted one
//!   watchdog period after its last renewal. `WatchdogSec=` should be at
//!   least the TTL: renewals come about every third of it, and a restart
//!   then comes only once the lease would have been given up anyway.
//!   `watch-hosts` holds no lease and sends none.

use std::os::unix::net::UnixDatagram;

/// Where notifications go, if a service manager asked for them.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    target: Target,
}

#[derive(Debug)]
enum Target {
    Path(std::path::PathBuf),
    Abstract(Vec<u8>),
}

impl Notifier {
    /// From `NOTIFY_SOCKET` as `var` reads it; `None` when unset, empty, or
    /// no socket can be made.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<Notifier> {
        let name = var("NOTIFY_SOCKET").filter(|n| !n.is_empty())?;
        let target = match name.strip_prefix('@') {
            Some(rest) => Target::Abstract(rest.as_bytes().to_vec()),
            None => Target::Path(name.into()),
        };
        let socket = UnixDatagram::unbound().ok()?;
        Some(Notifier { socket, target })
    }

    /// Sends `state` (newline-separated `KEY=value` lines).
    pub fn send(&self, state: &str) {
        let _ = match &self.target {
            Target::Path(path) => self.socket.send_to(state.as_bytes(), path),
            Target::Abstract(name) => abstract_addr(name)
                .and_then(|addr| self.socket.send_to_addr(state.as_bytes(), &addr)),
        };
    }
}

/// The watchdog period the service manager asked for: `WATCHDOG_USEC`
/// (microseconds, above 0), for this process only (`WATCHDOG_PID`, when
/// set, names it). `None` when there is no watchdog or the values are not
/// understood.
pub fn watchdog_period(
    var: impl Fn(&str) -> Option<String>,
    pid: u32,
) -> Option<std::time::Duration> {
    let usec: u64 = var("WATCHDOG_USEC")?
        .trim()
        .parse()
        .ok()
        .filter(|&u| u > 0)?;
    if let Some(for_pid) = var("WATCHDOG_PID") {
        if for_pid.trim().parse::<u32>().ok() != Some(pid) {
            return None;
        }
    }
    Some(std::time::Duration::from_micros(usec))
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &[u8]) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name)
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_: &[u8]) -> std::io::Result<std::os::unix::net::SocketAddr> {
    Err(std::io::Error::other(
        "abstract sockets exist only on Linux",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn datagrams_reach_a_path_socket_and_nothing_happens_without_one() {
        let dir = std::env::temp_dir().join(format!("fleetcoord-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).expect("bind");
        listener
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let name = path.to_string_lossy().into_owned();
        let notifier = Notifier::from_env(|_| Some(name.clone())).expect("a notifier");
        notifier.send("READY=1\nSTATUS=registered");
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).expect("a datagram");
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=registered");
        assert!(Notifier::from_env(|_| None).is_none());
        assert!(Notifier::from_env(|_| Some(String::new())).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_watchdog_period_is_for_this_process_only() {
        let env = |usec: Option<&'static str>, pid: Option<&'static str>| {
            move |name: &str| match name {
                "WATCHDOG_USEC" => usec.map(String::from),
                "WATCHDOG_PID" => pid.map(String::from),
                _ => None,
            }
        };
        assert_eq!(
            watchdog_period(env(Some("10000000"), None), 7),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            watchdog_period(env(Some("2500000"), Some("7")), 7),
            Some(Duration::from_millis(2500))
        );
        // Meant for another process (a parent's watchdog, inherited).
        assert_eq!(watchdog_period(env(Some("2500000"), Some("8")), 7), None);
        assert_eq!(watchdog_period(env(None, Some("7")), 7), None);
        assert_eq!(watchdog_period(env(Some("0"), None), 7), None);
        assert_eq!(watchdog_period(env(Some("soon"), None), 7), None);
        assert_eq!(watchdog_period(env(Some("-5"), None), 7), None);
    }
}
