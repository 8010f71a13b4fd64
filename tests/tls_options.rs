//! `Tls` built from PEM and from files: what it keeps, what it gives
//! back, and the argument each bad input is blamed on. No server: these
//! are checked before any connection is made.

use fleetcoord::testing::TestPki;
use fleetcoord::{Error, Tls};

fn blamed_on(result: fleetcoord::Result<Tls>) -> &'static str {
    match result {
        Err(Error::InvalidArgument { what, .. }) => what,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn files_and_pem_give_the_same_tls_and_its_parts_back() {
    let pki = TestPki::generate().unwrap();
    let from_files = Tls::from_ca_file(pki.ca_path())
        .unwrap()
        .with_client_files(pki.client_cert_path(), pki.client_key_path())
        .unwrap();
    assert_eq!(from_files.ca_pem(), pki.ca_pem().as_bytes());
    assert!(from_files.has_client_identity());
    let cert = std::fs::read(pki.client_cert_path()).unwrap();
    assert_eq!(from_files.client_cert_pem(), Some(cert.as_slice()));
    assert_eq!(from_files.server_name(), None);

    let ca_only = Tls::new(pki.ca_pem()).unwrap();
    assert_eq!(ca_only.client_cert_pem(), None);
    assert!(!ca_only.has_client_identity());
    let named = ca_only.with_server_name("etcd.internal").unwrap();
    assert_eq!(named.server_name(), Some("etcd.internal"));
    // The key never shows, whatever holds it.
    let key = std::fs::read_to_string(pki.client_key_path()).unwrap();
    let body = key.lines().nth(1).unwrap();
    assert!(!format!("{from_files:?}").contains(body));
}

#[test]
fn a_server_name_must_be_one_word_of_printable_text() {
    let pki = TestPki::generate().unwrap();
    for bad in ["", "etcd internal", "etcd\n", "etcd\u{7}", "\t"] {
        let tls = Tls::new(pki.ca_pem()).unwrap();
        assert_eq!(
            blamed_on(tls.with_server_name(bad)),
            "server_name",
            "{bad:?}"
        );
    }
    let tls = Tls::new(pki.ca_pem()).unwrap();
    assert!(tls.with_server_name("127.0.0.1").is_ok());
}

#[test]
fn each_bad_file_or_block_is_blamed_on_its_argument() {
    let pki = TestPki::generate().unwrap();
    let missing = pki.dir().join("missing.pem");
    assert_eq!(blamed_on(Tls::from_ca_file(&missing)), "ca");
    // A certificate block whose body is not base64.
    let broken = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
    assert_eq!(blamed_on(Tls::new(broken)), "ca");
    let broken_file = pki.dir().join("broken.pem");
    std::fs::write(&broken_file, broken).unwrap();
    assert_eq!(blamed_on(Tls::from_ca_file(&broken_file)), "ca");
    // A key where the certificate belongs holds no certificate.
    assert_eq!(blamed_on(Tls::from_ca_file(pki.client_key_path())), "ca");

    let tls = || Tls::new(pki.ca_pem()).unwrap();
    assert_eq!(
        blamed_on(tls().with_client_files(&missing, pki.client_key_path())),
        "client_cert"
    );
    assert_eq!(
        blamed_on(tls().with_client_files(&broken_file, pki.client_key_path())),
        "client_cert"
    );
    assert_eq!(
        blamed_on(tls().with_client_files(pki.client_cert_path(), &missing)),
        "client_key"
    );
    assert_eq!(
        blamed_on(tls().with_client_files(pki.client_cert_path(), pki.ca_path())),
        "client_key"
    );
}
