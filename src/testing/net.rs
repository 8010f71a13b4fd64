//! Loopback plumbing shared by the harness: free ports and a tiny HTTP client.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Ports this process already handed out. The kernel may give a port back
/// to a later `bind(0)` once we release it; remembering them keeps two
/// harness objects in one test binary from ever being given the same port.
fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A loopback port that was free a moment ago and was never handed out by
/// this process before. Another process may still grab it before etcd binds
/// it; callers retry the start when etcd reports the address in use.
pub(crate) fn free_port() -> io::Result<u16> {
    Ok(listener()?.local_addr()?.port())
}

/// A loopback listener on a port this process has not handed out, and
/// never will: a `bind(0)` of our own (the fault proxy's) could otherwise
/// take the port an etcd about to start was given, and that etcd's health
/// check would be answered, through the proxy, by another server.
pub(crate) fn listener() -> io::Result<TcpListener> {
    for _ in 0..64 {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let mut seen = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(port) {
            return Ok(listener);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        "no fresh loopback port after 64 attempts",
    ))
}

/// Sends one HTTP/1.0 request to `addr` and returns the status code and the
/// body. HTTP/1.0 makes the server close the connection after the answer,
/// so reading to EOF is the whole response.
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP status line"))?;
    Ok((status, body.to_string()))
}

/// `127.0.0.1:port` as a socket address.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
