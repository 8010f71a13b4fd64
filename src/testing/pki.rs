//! Certificates made at test time: a CA, a server certificate every member
//! of a test cluster shares, and a client certificate, as PEM files in a
//! temp dir.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::tls::Tls;
use crate::{Error, Result};

/// Which names the server certificate of a [`TestPki`] is valid for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerNames {
    /// `127.0.0.1` and `localhost`: what the harness's endpoints dial.
    Loopback,
    /// `localhost` only: dialling `127.0.0.1` is a name mismatch, which
    /// [`Tls::with_server_name`]`("localhost")` repairs.
    LocalhostOnly,
}

/// A CA with a server and a client certificate signed by it, written to a
/// temp dir removed on drop (ECDSA P-256, PKCS#8 PEM keys, valid for the
/// usual rcgen default of many years), and an expired client certificate.
///
/// ```
/// use fleetcoord::testing::TestPki;
/// use fleetcoord::Tls;
///
/// let pki = TestPki::generate()?;
/// let tls: Tls = pki.client_tls()?; // CA plus client certificate
/// assert!(tls.has_client_identity());
/// let other = TestPki::generate()?; // a CA the servers of `pki` never heard of
/// assert_ne!(pki.ca_pem(), other.ca_pem());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub struct TestPki {
    ca_pem: String,
    server_names: ServerNames,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .field("server_names", &self.server_names)
            .finish_non_exhaustive()
    }
}

const CA: &str = "ca.pem";
const SERVER_CERT: &str = "server.pem";
const SERVER_KEY: &str = "server-key.pem";
const CLIENT_CERT: &str = "client.pem";
const CLIENT_KEY: &str = "client-key.pem";
const EXPIRED_CERT: &str = "client-expired.pem";
const EXPIRED_KEY: &str = "client-expired-key.pem";

fn pki_error(e: rcgen::Error) -> Error {
    Error::Io(std::io::Error::other(format!(
        "cannot generate test certificates: {e}"
    )))
}

impl TestPki {
    /// A fresh CA and certificates; the server's for
    /// [`ServerNames::Loopback`].
    pub fn generate() -> Result<TestPki> {
        TestPki::generate_for(ServerNames::Loopback)
    }

    /// A fresh CA and certificates, the server's valid for `names`.
    pub fn generate_for(names: ServerNames) -> Result<TestPki> {
        let dir = tempfile::Builder::new()
            .prefix("fleetcoord-pki-")
            .tempdir()?;

        let ca_key = KeyPair::generate().map_err(pki_error)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        // A name of its own: two test CAs with one name would make a
        // certificate of one look like a forgery by the other (rustls then
        // says BadSignature, not UnknownIssuer).
        ca_params.distinguished_name.push(
            DnType::CommonName,
            format!("fleetcoord test CA {}", uuid::Uuid::new_v4()),
        );
        let ca_cert = ca_params.self_signed(&ca_key).map_err(pki_error)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let mut server =
            CertificateParams::new(vec!["localhost".to_string()]).map_err(pki_error)?;
        if names == ServerNames::Loopback {
            server
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        }
        server
            .distinguished_name
            .push(DnType::CommonName, "fleetcoord test etcd");
        // etcd also dials its own client URL (grpc-gateway) with this
        // certificate, hence client auth as well.
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server_key = KeyPair::generate().map_err(pki_error)?;
        let server_cert = server.signed_by(&server_key, &issuer).map_err(pki_error)?;

        let mut client = CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
        client
            .distinguished_name
            .push(DnType::CommonName, "fleetcoord test client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().map_err(pki_error)?;
        let client_cert = client.signed_by(&client_key, &issuer).map_err(pki_error)?;
        // The same client, but its certificate expired (in 2021).
        client.not_before = rcgen::date_time_ymd(2020, 1, 1);
        client.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let expired_key = KeyPair::generate().map_err(pki_error)?;
        let expired_cert = client.signed_by(&expired_key, &issuer).map_err(pki_error)?;

        let ca_pem = ca_cert.pem();
        for (name, pem) in [
            (CA, ca_pem.clone()),
            (SERVER_CERT, server_cert.pem()),
            (SERVER_KEY, server_key.serialize_pem()),
            (CLIENT_CERT, client_cert.pem()),
            (CLIENT_KEY, client_key.serialize_pem()),
            (EXPIRED_CERT, expired_cert.pem()),
            (EXPIRED_KEY, expired_key.serialize_pem()),
        ] {
            std::fs::write(dir.path().join(name), pem)?;
        }
        Ok(TestPki {
            ca_pem,
            server_names: names,
            dir,
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate's file (etcdctl's `--cacert`).
    pub fn ca_path(&self) -> PathBuf {
        self.path(CA)
    }

    /// The server certificate's file.
    pub fn server_cert_path(&self) -> PathBuf {
        self.path(SERVER_CERT)
    }

    /// The server key's file.
    pub fn server_key_path(&self) -> PathBuf {
        self.path(SERVER_KEY)
    }

    /// The client certificate's file (etcdctl's `--cert`).
    pub fn client_cert_path(&self) -> PathBuf {
        self.path(CLIENT_CERT)
    }

    /// The client key's file (etcdctl's `--key`).
    pub fn client_key_path(&self) -> PathBuf {
        self.path(CLIENT_KEY)
    }

    /// A client certificate signed by this CA that expired on 2021-01-01
    /// (and its key's file is [`TestPki::expired_client_key_path`]): what
    /// a server verifying clients refuses.
    pub fn expired_client_cert_path(&self) -> PathBuf {
        self.path(EXPIRED_CERT)
    }

    /// The key of [`TestPki::expired_client_cert_path`]'s certificate.
    pub fn expired_client_key_path(&self) -> PathBuf {
        self.path(EXPIRED_KEY)
    }

    /// The names the server certificate is valid for.
    pub fn server_names(&self) -> ServerNames {
        self.server_names
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// TLS trusting this CA, without a client certificate.
    pub fn server_tls(&self) -> Result<Tls> {
        Tls::from_ca_file(self.ca_path())
    }

    /// TLS trusting this CA, with the client certificate.
    pub fn client_tls(&self) -> Result<Tls> {
        self.server_tls()?
            .with_client_files(self.client_cert_path(), self.client_key_path())
    }

    /// TLS trusting this CA, with the expired client certificate
    /// ([`TestPki::expired_client_cert_path`]): building it succeeds, a
    /// server verifying clients refuses it.
    pub fn expired_client_tls(&self) -> Result<Tls> {
        self.server_tls()?.with_client_files(
            self.expired_client_cert_path(),
            self.expired_client_key_path(),
        )
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
