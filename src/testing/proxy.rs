//! An in-process TCP proxy that can blackhole, delay and reset connections.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// What the proxy does with bytes, in both directions.
///
/// `#[non_exhaustive]`: more faults (e.g. bandwidth limits) may be added;
/// code that matches on a mode needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Forward everything at once.
    Pass,
    /// Keep connections open (and accept new ones) but discard every byte
    /// in both directions, like a network partition in which nothing is
    /// acknowledged as closed. Bytes discarded mid-stream are lost for good,
    /// so a protocol connection usually fails once traffic passes again.
    Blackhole,
    /// Forward every byte this long after it was read; order is kept. A
    /// delay too long to add to the current time (`Duration::MAX`) discards
    /// the bytes, as [`Mode::Blackhole`] does.
    Delay(Duration),
}

/// An in-process TCP proxy on `127.0.0.1:0` in front of one loopback
/// target, for injecting network faults between a client and etcd.
///
/// Guarantees: the mode applies to existing and new connections from the
/// moment [`set_mode`](FaultProxy::set_mode) returns, to bytes read after
/// that; going back to [`Mode::Pass`] lets existing connections carry
/// traffic again. [`reset_all`](FaultProxy::reset_all) closes every current
/// connection on both sides. Dropping the proxy stops accepting and closes
/// all connections.
///
/// ```
/// use std::io::{Read, Write};
/// use std::net::TcpStream;
/// use fleetcoord::testing::{EtcdServer, FaultProxy, Mode};
///
/// let etcd = EtcdServer::start()?;
/// let proxy = FaultProxy::start(&etcd.endpoint())?;
/// // Point the client under test at proxy.endpoint() instead of etcd's.
/// let health = |ep: &str| -> std::io::Result<String> {
///     let mut s = TcpStream::connect(ep)?;
///     s.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
///     s.write_all(b"GET /health HTTP/1.0\r\n\r\n")?;
///     let mut answer = String::new();
///     s.read_to_string(&mut answer)?;
///     Ok(answer)
/// };
/// assert!(health(&proxy.endpoint())?.contains(r#""health":"true""#));
/// proxy.set_mode(Mode::Blackhole);
/// assert!(health(&proxy.endpoint()).is_err()); // the read times out
/// proxy.set_mode(Mode::Pass);
/// assert!(health(&proxy.endpoint())?.contains(r#""health":"true""#));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    mode: Mutex<Mode>,
    stop: AtomicBool,
    /// Clones of both sockets of every open connection, to close them.
    conns: Mutex<HashMap<u64, [TcpStream; 2]>>,
    next_id: AtomicU64,
}

impl Shared {
    fn mode(&self) -> Mode {
        *lock(&self.mode)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking pump thread must not take the whole proxy down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FaultProxy {
    /// Starts a proxy forwarding to `target` (`host:port`), in
    /// [`Mode::Pass`]. The target must resolve to loopback addresses only:
    /// this is a test tool and refuses to relay traffic anywhere else
    /// ([`Error::InvalidArgument`] for `target`).
    pub fn start(target: &str) -> Result<FaultProxy> {
        let resolved: Vec<SocketAddr> = target
            .to_socket_addrs()
            .map_err(|e| Error::invalid("target", format!("cannot resolve {target:?}: {e}")))?
            .collect();
        let target_addr = match resolved.first() {
            Some(first) if resolved.iter().all(|a| a.ip().is_loopback()) => *first,
            Some(_) => {
                return Err(Error::invalid(
                    "target",
                    format!(
                        "{target:?} is not a loopback address; FaultProxy only relays to loopback"
                    ),
                ))
            }
            None => {
                return Err(Error::invalid(
                    "target",
                    format!("{target:?} resolves to nothing"),
                ))
            }
        };
        // Blocking: a connection is accepted the moment it arrives (a
        // polled listener added up to a poll interval to every connect,
        // as much as a whole round trip of a `Mode::Delay`). Drop wakes it.
        let listener = super::net::listener()?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: target_addr,
            mode: Mutex::new(Mode::Pass),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("fault-proxy-accept".into())
                .spawn(move || accept_loop(&listener, &shared))?
        };
        Ok(FaultProxy {
            addr,
            target: target_addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// `127.0.0.1:PORT`, where clients connect instead of the target.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// The address traffic is forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Switches the mode for existing and new connections.
    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.shared.mode) = mode;
    }

    /// Closes every current connection on both sides (the client sees the
    /// connection end; so does the target) and returns how many there were.
    /// New connections are accepted as before.
    pub fn reset_all(&self) -> usize {
        close_all(&self.shared)
    }

    /// How many proxied connections are open right now.
    pub fn connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            // The acceptor blocks in `accept`: one connection of our own
            // wakes it to see the stop. Should even that fail (no file
            // descriptor left), it is left to end with the process rather
            // than block this drop.
            match TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)) {
                Ok(_) => {
                    let _ = acceptor.join();
                }
                Err(_) => drop(acceptor),
            }
        }
        close_all(&self.shared);
    }
}

fn close_all(shared: &Shared) -> usize {
    let conns: Vec<[TcpStream; 2]> = lock(&shared.conns).drain().map(|(_, c)| c).collect();
    for [a, b] in &conns {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    }
    conns.len()
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            // The drop's wake-up call (or a client as the proxy stops).
            Ok(_) if shared.stop.load(Ordering::SeqCst) => break,
            Ok((client, _)) => {
                let shared = Arc::clone(shared);
                let spawned = thread::Builder::new()
                    .name("fault-proxy-conn".into())
                    .spawn(move || {
                        let _ = serve(client, &shared);
                    });
                // Without a thread the client is dropped: it sees a close.
                drop(spawned);
            }
            // A transient accept error (e.g. out of fds).
            Err(_) => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Connects to the target and starts the two pumps of one connection.
fn serve(client: TcpStream, shared: &Arc<Shared>) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let upstream = TcpStream::connect_timeout(&shared.target, Duration::from_secs(2))?;
    client.set_nodelay(true)?;
    upstream.set_nodelay(true)?;
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    lock(&shared.conns).insert(id, [client.try_clone()?, upstream.try_clone()?]);
    if shared.stop.load(Ordering::SeqCst) {
        close_all(shared);
        return Ok(());
    }
    let live = Arc::new(AtomicUsize::new(2));
    let to_target = (client.try_clone()?, upstream.try_clone()?);
    let to_client = (upstream, client);
    for (src, dst) in [to_target, to_client] {
        let shared = Arc::clone(shared);
        let live = Arc::clone(&live);
        thread::Builder::new()
            .name("fault-proxy-pump".into())
            .spawn(move || {
                pump(src, dst, &shared);
                // The last direction to finish forgets the connection.
                if live.fetch_sub(1, Ordering::SeqCst) == 1 {
                    lock(&shared.conns).remove(&id);
                }
            })?;
    }
    Ok(())
}

/// Copies `src` to `dst` under the current mode until `src` ends. A writer
/// thread holds each chunk until its due time, so delays keep byte order
/// and a slow direction never stalls reading.
fn pump(mut src: TcpStream, dst: TcpStream, shared: &Arc<Shared>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = {
        let shared = Arc::clone(shared);
        let src = src.try_clone();
        thread::Builder::new()
            .name("fault-proxy-write".into())
            .spawn(move || write_loop(dst, &rx, &shared, src.ok()))
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let due = match shared.mode() {
            Mode::Pass => Instant::now(),
            Mode::Blackhole => continue,
            // A delay too long to represent would deliver never: that is a
            // blackhole, and the sum must not panic this thread.
            Mode::Delay(d) => match Instant::now().checked_add(d) {
                Some(due) => due,
                None => continue,
            },
        };
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    if let Ok(writer) = writer {
        let _ = writer.join();
    }
}

fn write_loop(
    mut dst: TcpStream,
    rx: &mpsc::Receiver<(Instant, Vec<u8>)>,
    shared: &Shared,
    src: Option<TcpStream>,
) {
    for (due, chunk) in rx {
        // Sleep in slices so dropping the proxy is not held up by a delay.
        while let Some(left) = due.checked_duration_since(Instant::now()) {
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            thread::sleep(left.min(Duration::from_millis(50)));
        }
        if dst.write_all(&chunk).is_err() {
            // The other side is gone: end the reading side too.
            if let Some(src) = &src {
                let _ = src.shutdown(Shutdown::Both);
            }
            return;
        }
    }
    // The source said EOF: pass the half-close on.
    let _ = dst.shutdown(Shutdown::Write);
}
