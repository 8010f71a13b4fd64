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
//! * `STOPPING=1` when the command stops.

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
}
