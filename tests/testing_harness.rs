//! The test harness itself against real etcd: processes, faults, proxy.
//!
//! Reads and writes go through etcd's JSON gateway (`/v3/kv/*`) and
//! `/health` over plain HTTP, so these tests do not depend on the client
//! code they are meant to test elsewhere.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use fleetcoord::testing::{EtcdBuilder, EtcdCluster, EtcdServer, FaultProxy, Mode};
use fleetcoord::Error;

/// One HTTP/1.0 exchange; `None` if nothing complete came back in `timeout`.
fn http(endpoint: &str, method: &str, path: &str, body: &str, timeout: Duration) -> Option<String> {
    let mut stream = TcpStream::connect(endpoint).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    exchange(&mut stream, method, path, body)
}

/// Sends one request on an open connection and reads until the server
/// closes it (HTTP/1.0).
fn exchange(stream: &mut TcpStream, method: &str, path: &str, body: &str) -> Option<String> {
    let request = format!(
        "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    (!answer.is_empty()).then_some(answer)
}

fn healthy_via(endpoint: &str) -> bool {
    http(endpoint, "GET", "/health", "", Duration::from_secs(2))
        .is_some_and(|a| a.contains(r#""health":"true""#))
}

fn b64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn put(endpoint: &str, key: &str, value: &str) {
    let body = format!(
        r#"{{"key":"{}","value":"{}"}}"#,
        b64(key.as_bytes()),
        b64(value.as_bytes())
    );
    let answer = http(
        endpoint,
        "POST",
        "/v3/kv/put",
        &body,
        Duration::from_secs(5),
    )
    .unwrap_or_else(|| panic!("no answer to put at {endpoint}"));
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
}

/// The value of `key` as etcd's JSON shows it (base64), or `None`.
fn get(endpoint: &str, key: &str) -> Option<String> {
    let body = format!(r#"{{"key":"{}"}}"#, b64(key.as_bytes()));
    let answer = http(
        endpoint,
        "POST",
        "/v3/kv/range",
        &body,
        Duration::from_secs(5),
    )?;
    let start = answer.find(r#""value":""#)? + r#""value":""#.len();
    let len = answer[start..].find('"')?;
    Some(answer[start..start + len].to_string())
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn base64_matches_known_vectors() {
    assert_eq!(b64(b""), "");
    assert_eq!(b64(b"f"), "Zg==");
    assert_eq!(b64(b"fo"), "Zm8=");
    assert_eq!(b64(b"foo"), "Zm9v");
    assert_eq!(b64(b"foobar"), "Zm9vYmFy");
}

#[test]
fn server_starts_healthy_and_drop_cleans_up() {
    let etcd = EtcdServer::start().unwrap();
    assert!(etcd.is_healthy());
    assert!(healthy_via(&etcd.endpoint()));
    assert_eq!(etcd.endpoints(), vec![etcd.endpoint()]);
    assert!(etcd.endpoint().starts_with("127.0.0.1:"));
    let pid = etcd.pid().unwrap();
    let data_dir = etcd.data_dir();
    assert!(process_exists(pid));
    assert!(data_dir.join("member").is_dir(), "etcd wrote no data");
    assert!(
        !etcd.log_tail(5).is_empty(),
        "etcd's output is not captured"
    );
    let endpoint = etcd.endpoint();
    drop(etcd);
    assert!(!process_exists(pid), "etcd {pid} survived drop");
    assert!(!data_dir.exists(), "data dir left behind");
    assert!(!healthy_via(&endpoint));
}

#[test]
fn extra_args_reach_etcd() {
    // A bogus flag must make the start fail, proving args are passed, and
    // the error must carry etcd's own complaint from the log.
    let err = EtcdBuilder::new()
        .arg("--no-such-flag-for-fleetcoord")
        .start()
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Connect { .. }), "{msg}");
    assert!(msg.contains("no-such-flag-for-fleetcoord"), "{msg}");

    let etcd = EtcdBuilder::new()
        .arg("--auto-compaction-retention=1")
        .start()
        .unwrap();
    assert!(etcd.is_healthy());
}

#[test]
fn kill_and_restart_keep_ports_and_data() {
    let mut etcd = EtcdServer::start().unwrap();
    let endpoint = etcd.endpoint();
    put(&endpoint, "/harness/k", "before-crash");
    let old_pid = etcd.pid().unwrap();

    etcd.kill().unwrap();
    assert_eq!(etcd.pid(), None);
    assert!(!process_exists(old_pid));
    assert!(!etcd.is_healthy());
    assert!(etcd.pause().is_err(), "pausing a killed server must fail");
    etcd.kill().unwrap(); // idempotent

    etcd.restart().unwrap();
    assert_eq!(etcd.endpoint(), endpoint);
    assert_ne!(etcd.pid(), Some(old_pid));
    assert_eq!(
        get(&endpoint, "/harness/k").as_deref(),
        Some(b64(b"before-crash").as_str())
    );

    // Restarting a running server is a kill plus a start.
    let pid = etcd.pid().unwrap();
    etcd.restart().unwrap();
    assert_ne!(etcd.pid(), Some(pid));
    assert!(etcd.is_healthy());
}

#[test]
fn pause_stops_answers_until_resume() {
    let etcd = EtcdServer::start().unwrap();
    etcd.pause().unwrap();
    let started = Instant::now();
    assert!(!etcd.is_healthy(), "a SIGSTOPped etcd answered");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the health probe did not wait"
    );
    assert!(process_exists(etcd.pid().unwrap()));

    etcd.resume().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !etcd.is_healthy() {
        assert!(
            Instant::now() < deadline,
            "etcd stayed unhealthy after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    put(&etcd.endpoint(), "/harness/after-pause", "v");
}

#[test]
fn drop_kills_a_paused_server() {
    let etcd = EtcdServer::start().unwrap();
    let pid = etcd.pid().unwrap();
    etcd.pause().unwrap();
    drop(etcd);
    assert!(!process_exists(pid));
}

#[test]
fn cluster_survives_losing_its_leader() {
    let mut cluster = EtcdCluster::start(3).unwrap();
    assert_eq!(cluster.len(), 3);
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    assert!(endpoints.iter().all(|e| e.starts_with("127.0.0.1:")));
    assert_ne!(endpoints[0], endpoints[1]);
    assert!(cluster.members().iter().all(EtcdServer::is_healthy));

    let leader = cluster.leader_index().unwrap();
    assert!(leader < 3);
    put(&endpoints[leader], "/harness/cluster", "replicated");

    cluster.kill(leader).unwrap();
    assert_eq!(cluster.member(leader).pid(), None);
    let next = cluster.leader_index().unwrap();
    assert_ne!(next, leader);
    let survivor = (0..3).find(|&i| i != leader && i != next).unwrap();
    // Linearizable reads on both survivors see the write made before.
    for i in [next, survivor] {
        assert_eq!(
            get(&endpoints[i], "/harness/cluster").as_deref(),
            Some(b64(b"replicated").as_str())
        );
    }

    cluster.restart(leader).unwrap();
    assert!(cluster.member(leader).is_healthy());
    assert_eq!(
        get(&endpoints[leader], "/harness/cluster").as_deref(),
        Some(b64(b"replicated").as_str())
    );

    // A paused member is not counted as leader and comes back on resume.
    let current = cluster.leader_index().unwrap();
    cluster.pause(current).unwrap();
    let during = cluster.leader_index().unwrap();
    assert_ne!(during, current);
    cluster.resume(current).unwrap();

    assert!(matches!(
        cluster.kill(3),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn cluster_of_zero_is_rejected() {
    assert!(matches!(
        EtcdCluster::start(0),
        Err(Error::InvalidArgument { what: "n", .. })
    ));
}

#[test]
fn proxy_passes_blackholes_and_resumes() {
    let etcd = EtcdServer::start().unwrap();
    let proxy = FaultProxy::start(&etcd.endpoint()).unwrap();
    assert_ne!(proxy.endpoint(), etcd.endpoint());
    assert_eq!(proxy.mode(), Mode::Pass);
    assert!(healthy_via(&proxy.endpoint()));

    // An idle connection opened before the partition survives it.
    let mut idle = TcpStream::connect(proxy.endpoint()).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();

    proxy.set_mode(Mode::Blackhole);
    assert!(
        !healthy_via(&proxy.endpoint()),
        "a blackholed proxy answered"
    );
    // Connections are still accepted: the client cannot tell a partition
    // from a slow server.
    let held = TcpStream::connect(proxy.endpoint()).unwrap();
    assert!(etcd.is_healthy(), "etcd itself stays reachable directly");

    proxy.set_mode(Mode::Pass);
    let answer = exchange(&mut idle, "GET", "/health", "").unwrap();
    assert!(answer.contains(r#""health":"true""#), "{answer}");
    assert!(healthy_via(&proxy.endpoint()));
    drop(held);
}

#[test]
fn proxy_reset_closes_current_connections_only() {
    let etcd = EtcdServer::start().unwrap();
    let proxy = FaultProxy::start(&etcd.endpoint()).unwrap();
    let mut a = TcpStream::connect(proxy.endpoint()).unwrap();
    let mut b = TcpStream::connect(proxy.endpoint()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.connections() < 2 {
        assert!(
            Instant::now() < deadline,
            "proxy never registered the connections"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(proxy.reset_all(), 2);
    for conn in [&mut a, &mut b] {
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 1];
        let n = conn.read(&mut buf);
        assert!(matches!(n, Ok(0) | Err(_)), "connection still open: {n:?}");
    }
    assert_eq!(proxy.connections(), 0);
    assert!(
        healthy_via(&proxy.endpoint()),
        "new connections must work after a reset"
    );
}

#[test]
fn proxy_delays_both_directions() {
    let etcd = EtcdServer::start().unwrap();
    let proxy = FaultProxy::start(&etcd.endpoint()).unwrap();
    proxy.set_mode(Mode::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    assert!(http(
        &proxy.endpoint(),
        "GET",
        "/health",
        "",
        Duration::from_secs(5)
    )
    .is_some_and(|a| a.contains(r#""health":"true""#)));
    // Request and answer are each held 300 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
}

/// `Duration::MAX` used to overflow `Instant + Duration` in the harness: a
/// delay that large panicked the proxy's thread, a health timeout that
/// large panicked `start`. Now the delay discards like a blackhole and the
/// health timeout means no limit.
#[test]
fn harness_takes_duration_max() {
    let etcd = EtcdBuilder::new()
        .health_timeout(Duration::MAX)
        .start()
        .expect("a health timeout of Duration::MAX waits without a limit");
    let proxy = FaultProxy::start(&etcd.endpoint()).unwrap();
    proxy.set_mode(Mode::Delay(Duration::MAX));
    assert!(
        !healthy_via(&proxy.endpoint()),
        "an endless delay delivered"
    );
    proxy.set_mode(Mode::Pass);
    assert!(
        healthy_via(&proxy.endpoint()),
        "the proxy works again after the endless delay"
    );
}

#[test]
fn proxy_drop_closes_connections() {
    let etcd = EtcdServer::start().unwrap();
    let proxy = FaultProxy::start(&etcd.endpoint()).unwrap();
    let endpoint = proxy.endpoint();
    let mut conn = TcpStream::connect(&endpoint).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.connections() < 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(proxy);
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(matches!(conn.read(&mut [0u8; 1]), Ok(0) | Err(_)));
    assert!(
        TcpStream::connect(&endpoint).is_err(),
        "listener still open after drop"
    );
}

#[test]
fn proxy_refuses_non_loopback_targets() {
    for target in ["192.0.2.1:2379", "[2001:db8::1]:2379", "not an address"] {
        match FaultProxy::start(target) {
            Err(Error::InvalidArgument { what: "target", .. }) => {}
            other => panic!("{target}: {other:?}"),
        }
    }
    assert!(FaultProxy::start("[::1]:2379").is_ok());
    assert!(FaultProxy::start("localhost:2379").is_ok());
}
