//! The `fleetcoord` binary against etcd with mutual TLS and auth, flags as
//! etcdctl spells them (and its `ETCDCTL_*` variables); a failed login at
//! `RUST_LOG=trace` prints no password and no key material; a refused
//! watch exits with etcd's reason.

use fleetcoord::testing::{EtcdBuilder, EtcdServer};
use std::process::{Command, Output, Stdio};

const PASSWORD: &str = "agent-s3cr3t-pw";
const WRONG: &str = "wrong-s3cr3t-pw";

fn cli(server: &EtcdServer) -> Command {
    let pki = server.pki().expect("TLS server");
    let mut command = Command::new(env!("CARGO_BIN_EXE_fleetcoord"));
    command
        .env_remove("ETCD_ENDPOINTS")
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("ETCDCTL_USER")
        .env_remove("ETCDCTL_PASSWORD")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .args(["--endpoints", &server.endpoint()])
        .arg("--cacert")
        .arg(pki.ca_path())
        .arg("--cert")
        .arg(pki.client_cert_path())
        .arg("--key")
        .arg(pki.client_key_path());
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn assert_no_secret(server: &EtcdServer, output: &Output) {
    let key = std::fs::read_to_string(server.pki().unwrap().client_key_path()).unwrap();
    let all = format!("{}{}", text(&output.stdout), text(&output.stderr));
    for secret in [PASSWORD, WRONG, EtcdServer::ROOT_PASSWORD] {
        assert!(!all.contains(secret), "{secret:?} printed:\n{all}");
    }
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!all.contains(line), "key material printed:\n{all}");
    }
}

#[test]
fn tls_and_auth_flags_and_no_secret_even_at_trace_level() {
    let server = EtcdBuilder::new()
        .client_cert_auth()
        .auth()
        .start()
        .expect("mTLS + auth etcd");
    server
        .create_user("agent", PASSWORD, Some("/coord/"))
        .expect("agent");

    let ok = cli(&server)
        .args(["--user", &format!("agent:{PASSWORD}"), "hosts"])
        .env("RUST_LOG", "trace")
        .output()
        .expect("spawn");
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert_no_secret(&server, &ok);

    let failed = cli(&server)
        .args(["--user", &format!("agent:{WRONG}"), "hosts"])
        .env("RUST_LOG", "trace")
        .output()
        .expect("spawn");
    let stderr = text(&failed.stderr);
    println!(
        "failed login at RUST_LOG=trace: exit {:?}, {} lines on stderr, last: {}",
        failed.status.code(),
        stderr.lines().count(),
        stderr.lines().last().unwrap_or_default()
    );
    assert_eq!(failed.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("authentication as \"agent\" failed"),
        "{stderr}"
    );
    assert_no_secret(&server, &failed);

    // The etcdctl variables, and a password file instead of name:password.
    let file = std::env::temp_dir().join(format!("fleetcoord-pw-{}", uuid::Uuid::new_v4()));
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let pki = server.pki().unwrap();
    let by_env = Command::new(env!("CARGO_BIN_EXE_fleetcoord"))
        .env_remove("ETCD_ENDPOINTS")
        .env_remove("RUST_LOG")
        .env("ETCDCTL_ENDPOINTS", server.endpoint())
        .env("ETCDCTL_CACERT", pki.ca_path())
        .env("ETCDCTL_CERT", pki.client_cert_path())
        .env("ETCDCTL_KEY", pki.client_key_path())
        .env("ETCDCTL_USER", "agent")
        .arg("--password-file")
        .arg(&file)
        .args(["kv", "set", "b", "k", "v"])
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    let _ = std::fs::remove_file(&file);
    assert_eq!(by_env.status.code(), Some(0), "{}", text(&by_env.stderr));
    assert_no_secret(&server, &by_env);

    // Without the client certificate: one line saying so.
    let no_cert = Command::new(env!("CARGO_BIN_EXE_fleetcoord"))
        .env_remove("RUST_LOG")
        .args(["--endpoints", &server.endpoint(), "--cacert"])
        .arg(pki.ca_path())
        .args(["--user", &format!("agent:{PASSWORD}"), "hosts"])
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    let stderr = text(&no_cert.stderr);
    assert_eq!(no_cert.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("client certificate"), "{stderr}");
    assert_no_secret(&server, &no_cert);

    // A watch the user may not make ends the command with etcd's reason,
    // not a bare "the host watch ended".
    server
        .create_user("outsider", PASSWORD, Some("/elsewhere/"))
        .expect("outsider");
    let denied = cli(&server)
        .args(["--user", &format!("outsider:{PASSWORD}"), "watch-hosts"])
        .env("RUST_LOG", "off")
        .output()
        .expect("spawn");
    let stderr = text(&denied.stderr);
    assert_eq!(denied.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("permission denied") && stderr.contains("/coord/hosts/"),
        "{stderr}"
    );
    assert_no_secret(&server, &denied);
}
