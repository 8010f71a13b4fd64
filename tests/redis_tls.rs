//! The Redis backend over TLS (`rediss://`): the conformance suite on a
//! standalone TLS server that wants client certificates and on a TLS
//! Cluster as the ACL user of the module docs (limited to `coord:*`); each
//! way a secured connection can be refused said in one line; and no
//! password or client key in `Debug` or errors. Not in `make test-matrix`:
//! its newer Redis is built without TLS (tests/redis_acl.rs runs there).

use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{Coordinator, RedisCoordinator};
use fleetcoord::error::ErrorKind;
use fleetcoord::testing::{RedisBuilder, TestPki};
use fleetcoord::Error;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

/// The ACL user of the module docs, as [`common::redis_acl_rules`] reads it.
fn rules() -> Vec<&'static str> {
    common::redis_acl_rules()
}

const USER: &str = "fleet";
const PASSWORD: &str = "fleet-pw-7f3a";

fn as_user(options: RedisOptions) -> RedisOptions {
    options.with_username(USER).with_password(PASSWORD)
}

fn conforms(urls: &str, options: RedisOptions, restart: impl Fn() -> fleetcoord::Result<()>) {
    let report = fleetcoord::conformance::run_with_restart(
        || {
            let options = options.clone().with_stream_max_len(64);
            Box::new(RedisCoordinator::with_options(urls, options).expect("connect"))
                as Box<dyn Coordinator>
        },
        restart,
    );
    report.assert_nothing_skipped();
}

#[test]
fn tls_standalone_with_client_certificates_conforms() {
    let server = RedisBuilder::new()
        .tls_auth_clients()
        .persistent()
        .start()
        .expect("start a TLS redis-server (run `make deps-redis`)");
    let url = server.url();
    assert!(url.starts_with("rediss://"), "{url}");
    let tls = server.pki().expect("TLS").client_tls().expect("client TLS");
    let server = Mutex::new(server);
    conforms(&url, RedisOptions::default().with_tls(tls), || {
        server.lock().unwrap_or_else(|p| p.into_inner()).restart()
    });
}

#[test]
fn tls_cluster_conforms_as_an_acl_user_limited_to_coord_keys() {
    let cluster = RedisBuilder::new()
        .tls()
        .persistent()
        .acl_user(USER, PASSWORD, &rules())
        .start_cluster(3, 0)
        .expect("start a TLS redis cluster (run `make deps-redis`)");
    let urls = cluster.urls();
    assert!(
        urls.split(',').all(|u| u.starts_with("rediss://")),
        "{urls}"
    );
    let tls = cluster.pki().expect("TLS").server_tls().expect("TLS");
    let options = as_user(RedisOptions::default().with_tls(tls));
    let cluster = Mutex::new(cluster);
    conforms(&urls, options, || {
        cluster.lock().unwrap_or_else(|p| p.into_inner()).restart()
    });
}

/// The one-line error `options` get from `url`, within the connect and
/// request timeouts.
fn refused(url: &str, options: RedisOptions) -> Error {
    let options = options
        .with_connect_timeout(Duration::from_secs(3))
        .with_request_timeout(Duration::from_secs(3));
    let started = Instant::now();
    let e = RedisCoordinator::with_options(url, options).expect_err("must be refused");
    assert!(started.elapsed() < Duration::from_secs(15), "{e}");
    let text = e.to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    e
}

fn kind(e: &Error) -> Option<ErrorKind> {
    match e {
        Error::Backend { kind, .. } | Error::Connect { kind, .. } => Some(*kind),
        _ => None,
    }
}

#[test]
fn refused_connections_say_why_in_one_line() {
    let server = RedisBuilder::new()
        .tls_auth_clients()
        .acl_user(USER, PASSWORD, &rules())
        .start()
        .expect("start a TLS redis-server (run `make deps-redis`)");
    let url = server.url();
    let pki = server.pki().expect("TLS");

    // A CA that did not sign the server's certificate.
    let other = TestPki::generate().expect("another CA");
    let wrong_ca = other
        .server_tls()
        .unwrap()
        .with_client_files(pki.client_cert_path(), pki.client_key_path())
        .unwrap();
    let e = refused(&url, RedisOptions::default().with_tls(wrong_ca));
    let text = e.to_string();
    assert!(
        text.contains(
            "TLS: the server's certificate is not trusted: it is not signed by the given CA"
        ),
        "{text}"
    );
    assert_eq!(kind(&e), Some(ErrorKind::Unavailable), "{text}");

    // No CA at all: the built-in public roots do not know the test CA.
    let text = refused(&url, RedisOptions::default()).to_string();
    assert!(
        text.contains("no CA was given (RedisOptions::with_tls)"),
        "{text}"
    );

    // The server wants a client certificate; none is given.
    let no_cert = pki.server_tls().unwrap();
    let text = refused(&url, RedisOptions::default().with_tls(no_cert)).to_string();
    assert!(
        text.contains("it most likely requires a client certificate"),
        "{text}"
    );

    // A client certificate of the right CA, but expired.
    let expired = pki.expired_client_tls().unwrap();
    let text = refused(&url, RedisOptions::default().with_tls(expired)).to_string();
    assert!(
        text.contains("TLS: the server refused the client certificate: it expired on 2021-01-01"),
        "{text}"
    );

    // The right certificates, the wrong password: WRONGPASS, not retryable,
    // the password never quoted.
    let tls = pki.client_tls().unwrap();
    let wrong = RedisOptions::default()
        .with_tls(tls.clone())
        .with_username(USER)
        .with_password("not-the-password");
    let e = refused(&url, wrong);
    let text = e.to_string();
    assert!(text.contains("WRONGPASS"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
    assert_eq!(kind(&e), Some(ErrorKind::PermissionDenied), "{text}");
    assert!(!e.is_retryable(), "{text}");

    // A plain redis:// URL with TLS configured is refused before dialling.
    let plain = format!("redis://127.0.0.1:{}", server.port());
    match RedisCoordinator::with_options(&plain, RedisOptions::default().with_tls(tls.clone())) {
        Err(Error::InvalidArgument { what: "url", why }) => {
            assert!(why.contains("use rediss://"), "{why}")
        }
        other => panic!("{:?}", other.map(|c| c.is_cluster())),
    }

    // And right everything works.
    let coord =
        RedisCoordinator::with_options(&url, as_user(RedisOptions::default().with_tls(tls)))
            .expect("connect with the client certificate as the ACL user");
    coord.ping().expect("ping");
}

#[test]
fn debug_and_errors_never_show_the_password_or_the_client_key() {
    let pki = TestPki::generate().expect("certificates");
    let key = std::fs::read_to_string(pki.client_key_path()).expect("key");
    let key_body: String = key
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<Vec<_>>()
        .join("");
    let secret = "s3cret-Pa55";
    let options = RedisOptions::default()
        .with_username("fleet")
        .with_password(secret)
        .with_tls(pki.client_tls().expect("client TLS"));
    let shown = format!("{options:?} {options:#?}");
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!shown.contains(line), "{shown}");
    }
    assert!(!shown.contains(&key_body), "{shown}");
    // A connection that fails (nothing listens on port 1) with the password
    // in the URL as well.
    let url = format!("rediss://fleet:{secret}@127.0.0.1:1");
    let e = RedisCoordinator::with_options(
        &url,
        options.with_connect_timeout(Duration::from_millis(500)),
    )
    .expect_err("nothing listens");
    let text = format!("{e} {e:?}");
    assert!(!text.contains(secret), "{text}");
    assert!(!text.contains(&key_body), "{text}");
    assert!(text.contains("rediss://fleet:***@127.0.0.1:1"), "{text}");
    // The harness keeps test passwords out of its `Debug` too.
    let builder = RedisBuilder::new().acl_user("fleet", secret, &rules());
    let shown = format!("{builder:?}");
    assert!(
        shown.contains("fleet") && !shown.contains(secret),
        "{shown}"
    );
}
