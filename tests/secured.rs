//! fleetcoord against secured etcd: TLS (good CA, wrong CA, wrong name),
//! mutual TLS (with and without a client certificate), and authentication
//! (a prefix-limited user, a wrong password, a user without the grant).
//! Each failure is one readable line that names what failed and holds no
//! secret.

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, EtcdCoordinatorOptions};
use fleetcoord::testing::{EtcdBuilder, EtcdServer, ServerNames, TestPki};
use fleetcoord::{
    list_hosts, Election, Error, ErrorKind, Etcd, EtcdOptions, EtcdUser, HostEvent, HostLiveness,
    HostWatcher, Tls, DEFAULT_HOSTS_PREFIX,
};
use std::time::{Duration, Instant};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(10);

fn options() -> EtcdOptions {
    EtcdOptions::default().with_connect_timeout(Duration::from_secs(5))
}

/// The reason of a failed connect, after checking it is one line that
/// came quickly (a TLS or login failure never waits for a timeout).
#[track_caller]
fn connect_error(endpoints: &[String], options: EtcdOptions) -> String {
    let started = Instant::now();
    match Etcd::with_options(endpoints, options) {
        Err(Error::Connect { reason, .. }) => {
            println!("connect failed in {:?}: {reason}", started.elapsed());
            assert!(!reason.contains('\n'), "not one line: {reason:?}");
            assert!(started.elapsed() < Duration::from_secs(4), "{reason}");
            reason
        }
        other => panic!("expected a Connect error, got {other:?}"),
    }
}

/// One round of every primitive through `etcd`, under the default prefix.
fn use_everything(etcd: &Etcd) {
    let me = Uuid::new_v4();
    let watcher = HostWatcher::watch(etcd).expect("watch hosts");
    assert_eq!(
        watcher.events().recv_timeout(WAIT).unwrap(),
        HostEvent::Synced
    );
    let host = HostLiveness::register(etcd, me, b"x", Duration::from_secs(5)).expect("register");
    match watcher.events().recv_timeout(WAIT).unwrap() {
        HostEvent::Up(info) => assert_eq!(info.id, me),
        other => panic!("expected Up, got {other:?}"),
    }
    let leadership = Election::new(etcd, "secured")
        .expect("election")
        .campaign(b"me")
        .expect("campaign");
    assert!(leadership.is_held());
    leadership.resign().expect("resign");
    host.close().expect("close");
}

#[test]
fn tls_with_the_right_ca_works_and_wrong_ca_or_name_say_so() {
    let server = EtcdBuilder::new().tls().start().expect("TLS etcd");
    let pki = server.pki().expect("pki");
    let endpoints = server.endpoints();

    let etcd = Etcd::with_options(&endpoints, options().with_tls(pki.server_tls().unwrap()))
        .expect("connect with the right CA");
    assert!(etcd.endpoints()[0].starts_with("https://127.0.0.1:"));
    use_everything(&etcd);

    // https:// spelled out works too; http:// with TLS is refused up front.
    let https = vec![format!("https://{}", server.endpoint())];
    Etcd::with_options(&https, options().with_tls(pki.server_tls().unwrap())).expect("https://");
    let http = vec![format!("http://{}", server.endpoint())];
    assert!(matches!(
        Etcd::with_options(&http, options().with_tls(pki.server_tls().unwrap())),
        Err(Error::InvalidArgument {
            what: "endpoints",
            ..
        })
    ));

    let stranger = TestPki::generate().unwrap();
    let reason = connect_error(
        &endpoints,
        options().with_tls(stranger.server_tls().unwrap()),
    );
    assert!(reason.contains("not signed by the given CA"), "{reason}");

    // Plain gRPC to a TLS port fails too, rather than hanging.
    let _ = Etcd::with_options(
        &endpoints,
        options().with_connect_timeout(Duration::from_secs(2)),
    );
}

#[test]
fn a_certificate_for_another_name_is_a_name_mismatch_unless_the_name_is_set() {
    let server = EtcdBuilder::new()
        .tls_for(ServerNames::LocalhostOnly)
        .start()
        .expect("TLS etcd");
    let pki = server.pki().expect("pki");
    let reason = connect_error(
        &server.endpoints(),
        options().with_tls(pki.server_tls().unwrap()),
    );
    assert!(reason.contains("not valid for the name"), "{reason}");

    let by_name = pki
        .server_tls()
        .unwrap()
        .with_server_name("localhost")
        .unwrap();
    let etcd = Etcd::with_options(&server.endpoints(), options().with_tls(by_name))
        .expect("connect checking the certificate's own name");
    use_everything(&etcd);
}

#[test]
fn mutual_tls_needs_the_client_certificate() {
    let server = EtcdBuilder::new()
        .client_cert_auth()
        .start()
        .expect("mTLS etcd");
    let pki = server.pki().expect("pki");

    let etcd = Etcd::with_options(
        &server.endpoints(),
        options().with_tls(pki.client_tls().unwrap()),
    )
    .expect("connect with a client certificate");
    use_everything(&etcd);

    let reason = connect_error(
        &server.endpoints(),
        options().with_tls(pki.server_tls().unwrap()),
    );
    assert!(reason.contains("requires a client certificate"), "{reason}");

    // A certificate from a CA the server does not trust.
    let stranger = TestPki::generate().unwrap();
    let foreign = pki
        .server_tls()
        .unwrap()
        .with_client_files(stranger.client_cert_path(), stranger.client_key_path())
        .unwrap();
    let reason = connect_error(&server.endpoints(), options().with_tls(foreign));
    assert!(
        reason.contains("refused the client certificate"),
        "{reason}"
    );

    // A certificate of the right CA that expired: the message says so,
    // rather than pointing at the CA.
    let expired = pki.expired_client_tls().unwrap();
    let reason = connect_error(&server.endpoints(), options().with_tls(expired));
    assert!(
        reason.contains("refused the client certificate: it expired on 2021-01-01 00:00:00 UTC"),
        "{reason}"
    );
}

#[test]
fn secrets_never_show_in_debug_or_errors() {
    let pki = TestPki::generate().unwrap();
    let key = std::fs::read_to_string(pki.client_key_path()).unwrap();
    let key_body: String = key.lines().nth(1).unwrap().to_string();
    let options = EtcdOptions::default()
        .with_tls(pki.client_tls().unwrap())
        .with_user(EtcdUser::new("agent", "s3cr3t-pw").unwrap());
    let shown = format!("{options:?} {options:#?}");
    assert!(!shown.contains("s3cr3t-pw"), "{shown}");
    assert!(!shown.contains(&key_body), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");

    // A key file that is not a key: the error names the file, not the text.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad-key.pem");
    std::fs::write(&bad, "-----BEGIN PRIVATE KEY-----\nnot-base64-s3cr3t\n").unwrap();
    let err = Tls::from_ca_file(pki.ca_path())
        .unwrap()
        .with_client_files(pki.client_cert_path(), &bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad-key.pem"), "{err}");
    assert!(!err.contains("s3cr3t"), "{err}");
}

/// Auth on: root, a user limited to `/coord/`, a user with no grant.
#[test]
fn a_prefix_limited_user_can_do_everything_under_its_prefix() {
    let server = EtcdBuilder::new().auth().start().expect("auth etcd");
    let agent = server
        .create_user("agent", "agent-pw", Some("/coord/"))
        .expect("agent");
    let stranger = server
        .create_user("stranger", "stranger-pw", None)
        .expect("stranger");

    let etcd = Etcd::with_options(&server.endpoints(), options().with_user(agent.clone()))
        .expect("log in as agent");
    use_everything(&etcd);
    // Every coordinator operation, as the public conformance suite runs
    // them, under the user's prefix.
    let endpoints = server.endpoints();
    let report = fleetcoord::conformance::run(|| {
        let etcd = Etcd::with_options(&endpoints, options().with_user(agent.clone())).expect("connect");
        let root = EtcdCoordinatorOptions::default()
            .with_root("/coord/conformance")
            .with_stream_max_len(64);
        Box::new(EtcdCoordinator::on_etcd_with_options(&etcd, root).expect("coordinator"))
            as Box<dyn Coordinator>
    });
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);

    // Wrong password: refused at connect, naming the user, not the password.
    let wrong = EtcdUser::new("agent", "not-the-pw").unwrap();
    let reason = connect_error(&server.endpoints(), options().with_user(wrong));
    assert!(
        reason.contains("authentication as \"agent\" failed"),
        "{reason}"
    );
    assert!(!reason.contains("not-the-pw"), "{reason}");

    // No user at all.
    let reason = connect_error(&server.endpoints(), options());
    assert!(reason.contains("no user was given"), "{reason}");

    // A user without the grant connects, then every primitive says
    // "permission denied" at once: no hang, no retry loop.
    let denied = Etcd::with_options(&server.endpoints(), options().with_user(stranger))
        .expect("log in as stranger");
    let started = Instant::now();
    let is_denied = |e: &Error| {
        matches!(
            e,
            Error::Etcd {
                kind: ErrorKind::PermissionDenied,
                ..
            }
        )
    };
    let e = HostLiveness::register(&denied, Uuid::new_v4(), b"x", Duration::from_secs(5))
        .expect_err("register without the grant");
    assert!(is_denied(&e), "{e:?}");
    // The watcher's events end (its documented way of giving up) instead
    // of waiting forever, and it says why; so does list_hosts.
    let watcher = HostWatcher::watch(&denied).expect("watcher starts");
    assert_eq!(
        watcher.events().recv_timeout(WAIT),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected)
    );
    let e = watcher.stop_reason().expect("the reason the events ended");
    assert!(is_denied(&e), "{e:?}");
    assert!(e.to_string().contains("/coord/hosts/"), "{e}");
    let e = list_hosts(&denied, DEFAULT_HOSTS_PREFIX).expect_err("list without the grant");
    assert!(is_denied(&e), "{e:?}");
    let e = Election::new(&denied, "secured")
        .and_then(|e| e.campaign(b"x"))
        .expect_err("campaign without the grant");
    assert!(is_denied(&e), "{e:?}");
    let coordinator = EtcdCoordinator::on_etcd(&denied).expect("coordinator");
    let e = coordinator.kv_set("b", "k", b"v").expect_err("kv_set");
    assert!(is_denied(&e), "{e:?}");
    let e = coordinator.kv_watch("b", "*").expect_err("kv_watch");
    assert!(is_denied(&e), "{e:?}");
    assert!(
        started.elapsed() < WAIT,
        "permission errors took {:?}",
        started.elapsed()
    );
    // root still works, with the harness's password.
    let root = EtcdUser::new("root", EtcdServer::ROOT_PASSWORD).unwrap();
    Etcd::with_options(&server.endpoints(), options().with_user(root)).expect("root");
}
