//! Self-healing keepalive against real faults: etcd killed and restarted,
//! etcd paused past the TTL, the client blackholed past the TTL. In each
//! case the host must lose its lease (state `Lost`), register again, and a
//! watcher must end up with exactly etcd's view of the fleet.
//!
//! The tests take a lock so they run one at a time: each needs seconds of
//! quiet timing, and three etcds plus clients on two cores would blur it.

mod common;

use common::{apply, connect};
use fleetcoord::testing::{EtcdServer, FaultProxy, Mode};
use fleetcoord::{
    list_hosts, Etcd, HostEvent, HostInfo, HostLiveness, HostWatcher, LivenessState,
    DEFAULT_HOSTS_PREFIX,
};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// TTL of the host under test. Short, so outages past it stay short.
const TTL: Duration = Duration::from_secs(2);
/// How long each fault lasts: past the TTL with a margin, so the host's
/// local deadline surely passes (it renews every TTL/3, its deadline is at
/// most one TTL after the last acknowledged renewal).
const OUTAGE: Duration = Duration::from_millis(3500);
/// How long recovery may take after the fault ends: reconnecting (HTTP/2
/// pings after 5 s of silence notice a dead connection), backoff up to a
/// few seconds, grant and put. 20 s is generous for a loaded machine.
const RECOVERY: Duration = Duration::from_secs(20);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fleet as etcd has it, retried while etcd is still coming back.
fn etcd_view(etcd: &Etcd) -> HashMap<Uuid, HostInfo> {
    let deadline = Instant::now() + RECOVERY;
    loop {
        match list_hosts(etcd, DEFAULT_HOSTS_PREFIX) {
            Ok(hosts) => return hosts.into_iter().map(|h| (h.id, h)).collect(),
            Err(e) if Instant::now() < deadline => {
                eprintln!("list_hosts: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("list_hosts kept failing: {e}"),
        }
    }
}

/// Registers a host on `host_etcd`, watches on `watch_etcd`, runs `fault`,
/// then checks recovery.
fn run_scenario(name: &str, host_etcd: &Etcd, watch_etcd: &Etcd, fault: impl FnOnce()) {
    let watcher = HostWatcher::watch(watch_etcd).expect("watch");
    assert_eq!(
        watcher
            .events()
            .recv_timeout(Duration::from_secs(10))
            .unwrap(),
        HostEvent::Synced
    );
    let mut view = HashMap::new();

    let id = Uuid::new_v4();
    let host = HostLiveness::register(host_etcd, id, b"healing", TTL).expect("register");
    let first_lease = host.lease().expect("registered");
    match watcher
        .events()
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
    {
        e @ HostEvent::Up(_) => apply(&mut view, e),
        other => panic!("expected Up, got {other:?}"),
    }

    let fault_start = Instant::now();
    fault();
    let fault_end = Instant::now();

    // Wait for a Registered state after a Lost one.
    let mut states = Vec::new();
    let deadline = Instant::now() + RECOVERY;
    let recovered_at = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match host.states().recv_timeout(left) {
            Ok(s) => {
                let healed = matches!(s, LivenessState::Registered { .. })
                    && states
                        .iter()
                        .any(|s| matches!(s, LivenessState::Lost { .. }));
                states.push(s);
                if healed {
                    break Instant::now();
                }
            }
            Err(_) => panic!(
                "{name}: no re-registration within {RECOVERY:?}; states {states:?}, now {:?}",
                host.state()
            ),
        }
    };
    println!(
        "{name}: fault lasted {:?}; registered again {:?} after it ended; states {states:?}",
        fault_end - fault_start,
        recovered_at - fault_end
    );
    assert!(
        states
            .iter()
            .any(|s| matches!(s, LivenessState::Lost { lease } if *lease == first_lease)),
        "{name}: the first lease was never reported Lost: {states:?}"
    );
    let lease = match host.state() {
        LivenessState::Registered { lease } => lease,
        other => panic!("{name}: not registered at the end: {other:?}"),
    };
    assert_ne!(lease, first_lease, "{name}: a lost lease cannot come back");

    // etcd has the key on the new lease ...
    let expected = etcd_view(watch_etcd);
    let mine = expected
        .get(&id)
        .unwrap_or_else(|| panic!("{name}: key missing in etcd: {expected:?}"));
    assert_eq!(mine.lease, lease);
    assert_eq!(mine.metadata, b"healing".to_vec());
    assert_eq!(expected.len(), 1);

    // ... and the watcher converges to exactly that, through consistent
    // events. Quiet for 1 s with a matching view counts as settled.
    let deadline = Instant::now() + RECOVERY;
    loop {
        match watcher.events().recv_timeout(Duration::from_secs(1)) {
            Ok(event) => {
                println!("{name}: watcher event {event:?}");
                apply(&mut view, event);
            }
            Err(_) if view == expected => break,
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "{name}: watcher view {view:?} never matched etcd {expected:?}"
        );
    }
    host.close().expect("close after recovery");
}

#[test]
fn heals_after_etcd_killed_and_restarted() {
    let _serial = serial();
    let mut server = EtcdServer::start().expect("etcd");
    let host_etcd = connect(&server.endpoint());
    let watch_etcd = connect(&server.endpoint());
    run_scenario("kill/restart", &host_etcd, &watch_etcd, || {
        server.kill().expect("kill etcd");
        std::thread::sleep(OUTAGE);
        server.restart().expect("restart etcd");
    });
}

#[test]
fn heals_after_etcd_paused_past_ttl() {
    let _serial = serial();
    let server = EtcdServer::start().expect("etcd");
    let host_etcd = connect(&server.endpoint());
    let watch_etcd = connect(&server.endpoint());
    run_scenario("pause/resume", &host_etcd, &watch_etcd, || {
        server.pause().expect("pause etcd");
        std::thread::sleep(OUTAGE);
        server.resume().expect("resume etcd");
    });
}

#[test]
fn heals_after_client_blackholed_past_ttl() {
    let _serial = serial();
    let server = EtcdServer::start().expect("etcd");
    let proxy = FaultProxy::start(&server.endpoint()).expect("proxy");
    let host_etcd = connect(&proxy.endpoint());
    let watch_etcd = connect(&server.endpoint());
    run_scenario("blackhole", &host_etcd, &watch_etcd, || {
        proxy.set_mode(Mode::Blackhole);
        std::thread::sleep(OUTAGE);
        proxy.set_mode(Mode::Pass);
    });
}
