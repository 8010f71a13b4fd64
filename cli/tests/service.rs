//! Running `fleetcoord` as a service: `Type=notify` readiness (a datagram
//! to `NOTIFY_SOCKET` once registered or leading, `STOPPING=1` at the
//! end), and the generated shell completions and man page.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::{start_etcd, ChildGuard};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(15);

fn cli() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetcoord"));
    command
        .env_remove("ETCD_ENDPOINTS")
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null());
    command
}

/// A notify socket in a directory of its own, as a service manager makes.
struct NotifySocket {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(name: &str) -> NotifySocket {
        let dir = std::env::temp_dir().join(format!("fleetcoord-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("socket dir");
        let path = dir.join("notify");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket { dir, path, socket }
    }

    /// The next datagram, as text; `None` after `WAIT`.
    fn next(&self) -> Option<String> {
        self.socket.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut buf = [0u8; 4096];
        let n = self.socket.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn terminate(child: &ChildGuard) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success());
}

fn wait_exit(child: &mut ChildGuard) -> Option<i32> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code();
        }
        assert!(Instant::now() < deadline, "fleetcoord did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn agent_says_ready_once_registered_and_stopping_at_the_end() {
    let server = start_etcd();
    let notify = NotifySocket::bind("agent");
    let started = Instant::now();
    let mut agent = ChildGuard(
        cli()
            .args(["--endpoints", &server.endpoint(), "agent", "--ttl", "30s"])
            .args(["--host-id", "5b8f0c1e-2d3a-4e6f-9a7b-1c2d3e4f5a6b"])
            .env("NOTIFY_SOCKET", &notify.path)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn fleetcoord"),
    );
    let ready = notify.next().expect("a readiness datagram");
    assert_eq!(ready, "READY=1\nSTATUS=registered");
    // Ready means registered: the host is listed by then.
    let hosts = cli()
        .args(["--endpoints", &server.endpoint(), "--json", "hosts"])
        .output()
        .expect("hosts");
    assert_eq!(String::from_utf8_lossy(&hosts.stdout).lines().count(), 1);
    assert!(started.elapsed() < WAIT);
    terminate(&agent);
    let mut rest = Vec::new();
    while let Some(datagram) = notify.next() {
        let stopping = datagram == "STOPPING=1";
        rest.push(datagram);
        if stopping {
            break;
        }
    }
    assert_eq!(
        rest.last().map(String::as_str),
        Some("STOPPING=1"),
        "{rest:?}"
    );
    assert_eq!(wait_exit(&mut agent), Some(0));
}

#[test]
fn a_waiting_candidate_is_not_ready_until_it_leads() {
    let server = start_etcd();
    let first_socket = NotifySocket::bind("first");
    let second_socket = NotifySocket::bind("second");
    let elect = |socket: &NotifySocket, value: &str| {
        ChildGuard(
            cli()
                .args([
                    "--endpoints",
                    &server.endpoint(),
                    "elect",
                    "svc",
                    "--value",
                    value,
                ])
                .env("NOTIFY_SOCKET", &socket.path)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn fleetcoord"),
        )
    };
    let mut first = elect(&first_socket, "a");
    assert_eq!(
        first_socket.next().as_deref(),
        Some("READY=1\nSTATUS=leading")
    );
    let mut second = elect(&second_socket, "b");
    second_socket
        .socket
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    assert!(
        second_socket.socket.recv(&mut buf).is_err(),
        "the second candidate waits, so it is not ready"
    );
    terminate(&first);
    assert_eq!(wait_exit(&mut first), Some(0));
    assert_eq!(
        second_socket.next().as_deref(),
        Some("READY=1\nSTATUS=leading")
    );
    terminate(&second);
    assert_eq!(wait_exit(&mut second), Some(0));
}

#[test]
fn completions_are_valid_bash_and_the_man_page_names_every_command() {
    let script = cli()
        .args(["completions", "bash"])
        .output()
        .expect("completions");
    assert!(script.status.success());
    let script = String::from_utf8(script.stdout).expect("utf-8");
    assert!(script.contains("_fleetcoord()"), "{script:.200}");
    let syntax = Command::new("bash")
        .args(["-n", "-c", &script])
        .status()
        .expect("bash");
    assert!(syntax.success(), "bash -n refused the completion script");
    let page = cli().arg("man").output().expect("man");
    assert!(page.status.success());
    let page = String::from_utf8(page.stdout).expect("utf-8");
    assert!(
        page.starts_with(".ie") && page.contains(".TH fleetcoord 1"),
        "{page:.200}"
    );
    for command in ["agent", "elect", "lock", "watch\\-hosts", "completions"] {
        assert!(page.contains(command), "the man page lacks {command}");
    }
    let bad = cli().args(["completions", "nosh"]).output().expect("spawn");
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}
