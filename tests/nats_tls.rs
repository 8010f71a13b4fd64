//! The NATS backend over TLS and with NKey and JWT (`.creds`) logins, on
//! real nats-servers the harness configures: the conformance suite over
//! TLS with a client certificate against `verify: true`, and over a creds
//! file against a server in operator mode; every refusal is one line
//! naming its cause; no secret shows in `Debug` or an error.

mod common;

use fleetcoord::coordinator::{
    connect, from_vars, ConnectSettings, Coordinator, NatsCoordinator, NatsCredentials, NatsOptions,
};
use fleetcoord::testing::{NatsBuilder, NatsServer, ServerNames, TestPki};
use fleetcoord::{Error, Tls};
use std::time::{Duration, Instant};

const HINT: &str = "start nats-server (`make deps-nats` installs it)";

/// Every refused connection is bounded by this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

fn options() -> NatsOptions {
    NatsOptions::default().with_connect_timeout(CONNECT_TIMEOUT)
}

fn client_tls(server: &NatsServer) -> Tls {
    server
        .pki()
        .expect("a TLS server has test certificates")
        .client_tls()
        .expect("the test client certificate")
}

fn ca_only(server: &NatsServer) -> Tls {
    let pki = server.pki().expect("a TLS server has test certificates");
    Tls::from_ca_file(pki.ca_path()).expect("the test CA")
}

/// The one-line message of a connection the server (or the TLS check)
/// refused, within the connect timeout and some slack.
fn refused(url: &str, options: NatsOptions) -> String {
    let started = Instant::now();
    let result = NatsCoordinator::with_options(url, options);
    assert!(
        started.elapsed() < CONNECT_TIMEOUT + Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    match result {
        Err(e @ Error::Connect { .. }) => {
            let text = e.to_string();
            assert!(!text.contains('\n'), "not one line: {text}");
            text
        }
        Err(other) => panic!("expected a backend error, got {other:?}"),
        Ok(c) => panic!("connected: {c:?}"),
    }
}

/// The one-line message of options refused before dialling.
fn invalid(url: &str, options: NatsOptions, field: &str) -> String {
    match NatsCoordinator::with_options(url, options) {
        Err(e @ Error::InvalidArgument { what, .. }) if what == field => {
            let text = e.to_string();
            assert!(!text.contains('\n'), "not one line: {text}");
            text
        }
        other => panic!("expected invalid {field}, got {other:?}"),
    }
}

fn conform(server: NatsServer, options: NatsOptions) {
    let url = server.url();
    let server = std::sync::Mutex::new(server);
    let report = fleetcoord::conformance::run_with_restart(
        || {
            let options = options.clone().with_stream_max_len(64);
            Box::new(NatsCoordinator::with_options(&url, options).expect("connect"))
                as Box<dyn Coordinator>
        },
        || server.lock().unwrap_or_else(|p| p.into_inner()).restart(),
    );
    common::assert_nats_conforms(&report);
}

#[test]
fn conforms_over_tls_with_a_client_certificate() {
    let server = NatsBuilder::new().tls_verify_clients().start().expect(HINT);
    assert!(server.url().starts_with("tls://"), "{}", server.url());
    let options = options().with_tls(client_tls(&server));
    conform(server, options);
}

#[test]
fn conforms_over_a_creds_file() {
    let server = NatsBuilder::new().jwt_auth().start().expect(HINT);
    let creds = server.creds_path().expect("a JWT server has a creds file");
    let options = options().with_credentials_file(creds);
    conform(server, options);
}

#[test]
fn tls_and_a_creds_file_together() {
    let server = NatsBuilder::new().tls().jwt_auth().start().expect(HINT);
    let creds = server.creds_path().expect("a JWT server has a creds file");
    let coord = NatsCoordinator::with_options(
        &server.url(),
        options()
            .with_tls(ca_only(&server))
            .with_credentials_file(creds),
    )
    .expect("connect");
    coord.kv_set("config", "mode", b"on").unwrap();
    assert_eq!(coord.kv_get("config", "mode").unwrap(), b"on");
    let id = coord.append_stream("audit", b"login").unwrap();
    assert_eq!(id.to_string(), "1");

    // with_tls makes a nats:// URL use TLS too.
    let plain_url = server.url().replace("tls://", "nats://");
    let coord = NatsCoordinator::with_options(
        &plain_url,
        options()
            .with_tls(ca_only(&server))
            .with_credentials_file(server.creds_path().unwrap()),
    )
    .expect("connect");
    assert_eq!(coord.kv_get("config", "mode").unwrap(), b"on");
}

#[test]
fn an_nkey_user_logs_in_and_a_wrong_one_is_refused() {
    let server = NatsBuilder::new().nkey_user().start().expect(HINT);
    let seed = server.nkey_seed().expect("an NKey server has a seed");
    let coord =
        NatsCoordinator::with_options(&server.url(), options().with_nkey(&seed)).expect("connect");
    coord.kv_set("b", "k", b"v").unwrap();
    assert_eq!(coord.kv_get("b", "k").unwrap(), b"v");

    // A valid user seed the server does not know: named by its public key.
    let other = NatsBuilder::new().nkey_user().start().expect(HINT);
    let wrong = other.nkey_seed().expect("a seed");
    let err = refused(&server.url(), options().with_nkey(&wrong));
    let public = other.user_public_key().expect("a public key");
    assert!(
        err.contains(&format!("refused NKey user {public}")),
        "{err}"
    );
    assert!(err.contains("authorization violation"), "{err}");
    assert!(!err.contains(&wrong), "{err}");

    // No credentials at all, and a token where an NKey is wanted.
    let err = refused(&server.url(), options());
    assert!(err.contains("requires credentials"), "{err}");
    let err = refused(&server.url(), options().with_token("t0ken-secret"));
    assert!(err.contains("refused the token"), "{err}");
    assert!(!err.contains("t0ken-secret"), "{err}");

    // Not a seed: refused before dialling, never quoted.
    let err = invalid(
        &server.url(),
        options().with_nkey("SUNOTASEEDSECRET"),
        "nkey",
    );
    assert!(!err.contains("SUNOTASEEDSECRET"), "{err}");
}

#[test]
fn a_server_certificate_from_another_ca_is_not_trusted() {
    let server = NatsBuilder::new().tls().start().expect(HINT);
    let stranger = TestPki::generate().unwrap();
    let tls = Tls::from_ca_file(stranger.ca_path()).unwrap();
    let err = refused(&server.url(), options().with_tls(tls));
    assert!(
        err.contains("the server's certificate is not signed by the given CA"),
        "{err}"
    );
    // The CA that did sign it is trusted.
    NatsCoordinator::with_options(&server.url(), options().with_tls(ca_only(&server)))
        .expect("the right CA")
        .ping()
        .unwrap();
}

#[test]
fn a_server_name_other_than_the_dialled_host() {
    let server = NatsBuilder::new()
        .tls_for(ServerNames::LocalhostOnly)
        .start()
        .expect(HINT);
    // The URL dials 127.0.0.1; the certificate names only localhost.
    let err = refused(&server.url(), options().with_tls(ca_only(&server)));
    assert!(err.contains("not valid for the name dialled"), "{err}");
    let named = ca_only(&server).with_server_name("localhost").unwrap();
    NatsCoordinator::with_options(&server.url(), options().with_tls(named))
        .expect("the certificate's name")
        .ping()
        .unwrap();
    // The name is checked, not merely accepted.
    let wrong = ca_only(&server).with_server_name("nats.example").unwrap();
    let err = refused(&server.url(), options().with_tls(wrong));
    assert!(err.contains("not valid for the name"), "{err}");
}

#[test]
fn a_missing_or_expired_client_certificate_against_verify_true() {
    let server = NatsBuilder::new().tls_verify_clients().start().expect(HINT);
    let err = refused(&server.url(), options().with_tls(ca_only(&server)));
    assert!(err.contains("requires a client certificate"), "{err}");

    let pki = server.pki().unwrap();
    let expired = pki.expired_client_tls().unwrap();
    let err = refused(&server.url(), options().with_tls(expired));
    assert!(
        err.contains("refused the client certificate: it expired on 2021-01-01"),
        "{err}"
    );
}

#[test]
fn tls_against_a_plain_server_is_refused() {
    let server = NatsServer::start().expect(HINT);
    let pki = TestPki::generate().unwrap();
    let err = refused(
        &server.url(),
        options().with_tls(Tls::from_ca_file(pki.ca_path()).unwrap()),
    );
    assert!(err.to_lowercase().contains("tls"), "{err}");
}

#[test]
fn bad_creds_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let base = NatsOptions::default().with_connect_timeout(CONNECT_TIMEOUT);

    let missing = dir.path().join("missing.creds");
    let err = invalid(
        "nats://127.0.0.1:1",
        base.clone().with_credentials_file(&missing),
        "credentials_file",
    );
    assert!(err.contains(&missing.display().to_string()), "{err}");

    let real = NatsBuilder::new().jwt_auth().start().expect(HINT);
    let text = std::fs::read_to_string(real.creds_path().unwrap()).unwrap();
    let seed = text
        .lines()
        .find(|l| l.starts_with("SU"))
        .expect("a seed line")
        .to_string();
    let jwt = text
        .lines()
        .find(|l| l.starts_with("eyJ"))
        .expect("a JWT line")
        .to_string();
    let cases = [
        (
            "garbage.creds",
            "not a creds file\n".to_string(),
            "holds no user JWT",
        ),
        (
            "no-seed.creds",
            format!("-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n"),
            "holds no NKey seed",
        ),
        (
            "bad-jwt.creds",
            text.replace(&jwt, "not-a-jwt"),
            "is not a JWT",
        ),
        (
            "bad-seed.creds",
            text.replace(&seed, "SUTHISISNOTASEED"),
            "is not an NKey seed",
        ),
    ];
    for (name, content, why) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let err = invalid(
            "nats://127.0.0.1:1",
            base.clone().with_credentials_file(&path),
            "credentials_file",
        );
        assert!(err.contains(&path.display().to_string()), "{name}: {err}");
        assert!(err.contains(why), "{name}: {err}");
        assert!(!err.contains(&seed) && !err.contains("SUTHISIS"), "{err}");
    }

    // A well-formed file of another operator's user: refused by the server.
    let stranger = NatsBuilder::new().jwt_auth().start().expect(HINT);
    let err = refused(
        &real.url(),
        options().with_credentials_file(stranger.creds_path().unwrap()),
    );
    assert!(err.contains("refused JWT user"), "{err}");
    assert!(err.contains(&stranger.user_public_key().unwrap()), "{err}");
}

#[test]
fn debug_never_shows_a_seed() {
    let seed = "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY";
    let creds = "/etc/nats/app.creds";
    let shown = format!(
        "{:?} {:#?} {:?}",
        NatsOptions::default().with_nkey(seed),
        NatsOptions::default().with_nkey(seed).credentials,
        NatsOptions::default().with_credentials_file(creds),
    );
    assert!(
        !shown.contains(seed) && !shown.contains("SUACSSL"),
        "{shown}"
    );
    assert!(shown.contains("NKey(<redacted>)"), "{shown}");
    assert!(shown.contains(creds), "{shown}");
    assert_eq!(
        NatsOptions::default()
            .with_credentials_file(creds)
            .credentials,
        NatsCredentials::CredentialsFile(creds.into())
    );
    // The server harness hides it too.
    let server = NatsBuilder::new().nkey_user().start().expect(HINT);
    let seed = server.nkey_seed().unwrap();
    let shown = format!("{server:?}");
    assert!(!shown.contains(&seed), "{shown}");
}

fn connect_error(result: fleetcoord::Result<Box<dyn Coordinator>>) -> String {
    match result {
        Ok(_) => panic!("connected"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn coord_variables_bring_tls_and_a_login() {
    let server = NatsBuilder::new()
        .tls_verify_clients()
        .nkey_user()
        .start()
        .expect(HINT);
    let pki = server.pki().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let seed_file = dir.path().join("seed");
    std::fs::write(&seed_file, format!("{}\n", server.nkey_seed().unwrap())).unwrap();
    let vars = [
        ("COORD", "nats".to_string()),
        ("COORD_URL", server.url()),
        ("COORD_TLS_CA", pki.ca_path().display().to_string()),
        (
            "COORD_TLS_CERT",
            pki.client_cert_path().display().to_string(),
        ),
        ("COORD_TLS_KEY", pki.client_key_path().display().to_string()),
        ("COORD_NATS_NKEY_FILE", seed_file.display().to_string()),
    ];
    let lookup = |vars: &[(&'static str, String)]| {
        let vars = vars.to_vec();
        move |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        }
    };
    let coord = from_vars(lookup(&vars), None);
    assert!(coord.capabilities().delivers, "not connected (noop)");
    coord.kv_set("config", "mode", b"on").unwrap();

    // Without the seed file the server refuses: from_vars degrades to
    // noop, connect says why.
    let settings = ConnectSettings::from_vars(lookup(&vars[..5])).unwrap();
    assert!(!from_vars(lookup(&vars[..5]), None).capabilities().delivers);
    let err = connect_error(connect("nats", Some(&server.url()), &settings));
    assert!(err.contains("requires credentials"), "{err}");

    // An unreadable seed file is named.
    let missing = dir.path().join("no-seed");
    let settings = settings.with_nats_nkey_file(&missing);
    let err = connect_error(connect("nats", Some(&server.url()), &settings));
    assert!(err.contains(&missing.display().to_string()), "{err}");
}
