//! How to reach a secured server: [`Tls`] (server verification and an
//! optional client certificate; the same settings serve etcd, NATS and
//! Redis) and [`EtcdUser`] (etcd's user name and password).
//!
//! Both keep their secrets out of sight: the `Debug` output of a client key
//! or a password is `<redacted>`, and no error built from them quotes them.
//! Certificates and keys are PEM; they are checked when the value is built
//! and again by [`crate::Etcd::connect`], so a wrong file is an
//! [`Error::InvalidArgument`] naming it, before anything is dialled.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use fleetcoord::testing::EtcdBuilder;
//! use fleetcoord::{Etcd, EtcdOptions, Tls};
//!
//! // A TLS etcd that also wants a client certificate, with certificates
//! // made for the test.
//! let server = EtcdBuilder::new().client_cert_auth().start()?;
//! let pki = server.pki().expect("a TLS server has test certificates");
//! let tls = Tls::from_ca_file(pki.ca_path())?
//!     .with_client_files(pki.client_cert_path(), pki.client_key_path())?;
//! let etcd = Etcd::with_options(&server.endpoints(), EtcdOptions::default().with_tls(tls))?;
//! assert!(etcd.endpoints()[0].starts_with("https://"));
//! # Ok(()) }
//! ```

#[cfg(feature = "nats")]
mod client_config;
#[cfg(any(feature = "nats", feature = "redis"))]
pub(crate) mod provider;
pub(crate) mod refusal;
mod validity;

use crate::error::{Error, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::fmt;
use std::path::Path;

/// TLS for the connection to a server (etcd, NATS, Redis): the CA bundle
/// that signs the servers' certificates, optionally a client certificate
/// and key (mutual TLS: etcd's `--client-cert-auth`, NATS's `verify: true`,
/// Redis's `tls-auth-clients`), and optionally the name to check the server's
/// certificate against instead of the endpoint's host.
///
/// Guarantees: the CA bundle holds at least one PEM certificate, the client
/// certificate at least one, and the key one PEM private key (PKCS#8,
/// PKCS#1 or SEC1); `Debug` shows sizes and the server name, never the key.
#[derive(Clone)]
pub struct Tls {
    ca: Vec<u8>,
    identity: Option<Identity>,
    server_name: Option<String>,
}

#[derive(Clone)]
struct Identity {
    cert: Vec<u8>,
    key: Secret,
}

/// Bytes or text that never show in `Debug` or `Display`.
#[derive(Clone)]
pub(crate) struct Secret(Vec<u8>);

impl Secret {
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Tls {
    /// TLS verified against the CA certificates in `ca_pem` (one or more
    /// PEM `CERTIFICATE` blocks); [`Error::InvalidArgument`] for `ca` when
    /// there is none.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Result<Tls> {
        let tls = Tls {
            ca: ca_pem.into(),
            identity: None,
            server_name: None,
        };
        check_certificates("ca", "the CA bundle", &tls.ca)?;
        Ok(tls)
    }

    /// [`Tls::new`] with the CA bundle read from `path` (etcdctl's
    /// `--cacert`); the error names the file.
    pub fn from_ca_file(path: impl AsRef<Path>) -> Result<Tls> {
        let path = path.as_ref();
        let pem = read("ca", "CA bundle", path)?;
        check_certificates("ca", &format!("the CA bundle {}", path.display()), &pem)?;
        Tls::new(pem)
    }

    /// This TLS with a client certificate (chain) and its private key, both
    /// PEM, for servers that verify clients. [`Error::InvalidArgument`] for
    /// `client_cert` or `client_key` when either holds no such PEM block;
    /// the message never quotes the key.
    pub fn with_client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Result<Tls> {
        let identity = Identity {
            cert: cert_pem.into(),
            key: Secret(key_pem.into()),
        };
        check_certificates("client_cert", "the client certificate", &identity.cert)?;
        check_key("the client key", identity.key.expose())?;
        self.identity = Some(identity);
        Ok(self)
    }

    /// [`Tls::with_client_identity`] with both read from files
    /// (etcdctl's `--cert` and `--key`); errors name the file.
    pub fn with_client_files(
        self,
        cert_path: impl AsRef<Path>,
        key_path: impl AsRef<Path>,
    ) -> Result<Tls> {
        let (cert_path, key_path) = (cert_path.as_ref(), key_path.as_ref());
        let cert = read("client_cert", "client certificate", cert_path)?;
        check_certificates(
            "client_cert",
            &format!("the client certificate {}", cert_path.display()),
            &cert,
        )?;
        let key = Secret(read("client_key", "client key", key_path)?);
        check_key(
            &format!("the client key {}", key_path.display()),
            key.expose(),
        )?;
        self.with_client_identity(cert, key.0)
    }

    /// This TLS checking the server's certificate against `name` instead of
    /// the endpoint's host: for endpoints given by address whose
    /// certificates name the servers otherwise. [`Error::InvalidArgument`]
    /// for `server_name` when it is empty or has whitespace or control
    /// characters.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Result<Tls> {
        let name = name.into();
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::invalid(
                "server_name",
                format!("{name:?} is not a host name or IP address"),
            ));
        }
        self.server_name = Some(name);
        Ok(self)
    }

    /// The CA bundle, PEM.
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca
    }

    /// The client certificate, PEM, when one is set.
    pub fn client_cert_pem(&self) -> Option<&[u8]> {
        self.identity.as_ref().map(|i| i.cert.as_slice())
    }

    /// Whether a client certificate and key are set.
    pub fn has_client_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// Why the client certificate (its first, the leaf) is not valid at
    /// `unix_now` (seconds since the epoch): expired, or not valid yet.
    /// `None` when it is valid then, when there is none, or when its
    /// validity cannot be read.
    pub(crate) fn client_cert_invalid_at(&self, unix_now: i64) -> Option<String> {
        let identity = self.identity.as_ref()?;
        let der = CertificateDer::pem_slice_iter(&identity.cert)
            .next()?
            .ok()?;
        let (not_before, not_after) = validity::validity(der.as_ref())?;
        if not_after.unix < unix_now {
            Some(format!("it expired on {not_after}"))
        } else if not_before.unix > unix_now {
            Some(format!("it is not valid before {not_before}"))
        } else {
            None
        }
    }

    /// The name the server's certificate is checked against, when it is not
    /// the endpoint's host.
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// The client certificate and key, PEM, for a client library's TLS
    /// settings (etcd-client's in the driver, the Redis backend's); never
    /// for messages. The key leaves this type only here.
    pub(crate) fn client_identity_pem(&self) -> Option<(&[u8], &[u8])> {
        self.identity
            .as_ref()
            .map(|i| (i.cert.as_slice(), i.key.expose()))
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &format_args!("{} bytes of PEM", self.ca.len()))
            .field(
                "client_cert",
                &self
                    .identity
                    .as_ref()
                    .map(|i| format!("{} bytes of PEM", i.cert.len())),
            )
            .field("client_key", &self.identity.as_ref().map(|i| &i.key))
            .field("server_name", &self.server_name)
            .finish()
    }
}

fn read(what: &'static str, name: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::invalid(
            what,
            format!("cannot read the {name} {}: {e}", path.display()),
        )
    })
}

fn check_certificates(what: &'static str, name: &str, pem: &[u8]) -> Result<()> {
    let mut count = 0usize;
    for cert in CertificateDer::pem_slice_iter(pem) {
        if cert.is_err() {
            return Err(Error::invalid(what, format!("{name} is not valid PEM")));
        }
        count += 1;
    }
    if count == 0 {
        return Err(Error::invalid(
            what,
            format!("{name} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    Ok(())
}

/// A PEM private key; the parser's error is not quoted, since it could
/// carry a fragment of the key.
fn check_key(name: &str, pem: &[u8]) -> Result<()> {
    match PrivateKeyDer::from_pem_slice(pem) {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::invalid(
            "client_key",
            format!("{name} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)"),
        )),
    }
}

/// An etcd user name and password (etcdctl's `--user name:password`).
///
/// Guarantees: `Debug` shows the name and `<redacted>` for the password;
/// nothing in fleetcoord formats the password into an error or a log line.
/// The client logs in when connecting and again whenever etcd says its
/// token expired, so a short `--auth-token-ttl` is invisible to callers.
#[derive(Clone)]
pub struct EtcdUser {
    name: String,
    password: Secret,
}

impl EtcdUser {
    /// `name` with `password`. [`Error::InvalidArgument`] for `user` when
    /// the name is empty or has control characters (etcd would refuse it).
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> Result<EtcdUser> {
        let name = name.into();
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err(Error::invalid(
                "user",
                "the user name must be non-empty text without control characters",
            ));
        }
        Ok(EtcdUser {
            name,
            password: Secret(password.into().into_bytes()),
        })
    }

    /// etcdctl's `name:password` form: split at the first `:`. Without a
    /// `:` it is an [`Error::InvalidArgument`] for `user` (the message
    /// quotes nothing of the text, which may be a mistyped password).
    pub fn parse(name_password: &str) -> Result<EtcdUser> {
        match name_password.split_once(':') {
            Some((name, password)) => EtcdUser::new(name, password),
            None => Err(Error::invalid(
                "user",
                "expected name:password (or a name with the password given separately)",
            )),
        }
    }

    /// The user name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The password for etcd-client; it leaves this type only here.
    pub(crate) fn password(&self) -> String {
        String::from_utf8_lossy(self.password.expose()).into_owned()
    }
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("password", &self.password)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate valid from `from` to `to` (years), and
    /// its key, PEM.
    #[cfg(feature = "testing")]
    fn certificate(from: i32, to: i32) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec!["client".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 6, 30);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[cfg(feature = "testing")]
    #[test]
    fn an_expired_or_early_client_certificate_says_so() {
        let (ca, _) = certificate(2020, 2040);
        let now = 1_800_000_000; // 2027-01-15
        let (expired, key) = certificate(2020, 2025);
        let tls = Tls::new(ca.clone())
            .unwrap()
            .with_client_identity(expired, key)
            .unwrap();
        assert_eq!(
            tls.client_cert_invalid_at(now).as_deref(),
            Some("it expired on 2025-06-30 00:00:00 UTC")
        );
        let (early, key) = certificate(2030, 2031);
        let tls = Tls::new(ca.clone())
            .unwrap()
            .with_client_identity(early, key)
            .unwrap();
        assert_eq!(
            tls.client_cert_invalid_at(now).as_deref(),
            Some("it is not valid before 2030-01-01 00:00:00 UTC")
        );
        let (valid, key) = certificate(2020, 2040);
        let tls = Tls::new(ca.clone())
            .unwrap()
            .with_client_identity(valid, key)
            .unwrap();
        assert_eq!(tls.client_cert_invalid_at(now), None);
        assert_eq!(Tls::new(ca).unwrap().client_cert_invalid_at(now), None);
    }

    const NOT_A_KEY: &[u8] =
        b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n";

    #[test]
    fn debug_never_shows_a_password_or_a_key() {
        let user = EtcdUser::parse("agent:hunter2:with-colon").unwrap();
        assert_eq!(user.name(), "agent");
        assert_eq!(user.password(), "hunter2:with-colon");
        let shown = format!("{user:?} {user:#?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");

        let secret = Secret(b"secret-key-bytes".to_vec());
        assert_eq!(format!("{secret:?}"), "<redacted>");
    }

    #[test]
    fn bad_pem_is_refused_without_quoting_it() {
        let err = Tls::new(b"hello".to_vec()).unwrap_err().to_string();
        assert!(err.contains("invalid ca"), "{err}");
        let err = check_key("the client key", b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("c2VjcmV0"), "{err}");
        // A well-formed key block parses; its bytes never reach a message.
        assert!(check_key("k", NOT_A_KEY).is_ok());
    }

    #[test]
    fn user_needs_a_name_and_a_colon() {
        assert!(EtcdUser::parse("no-colon").is_err());
        assert!(EtcdUser::parse(":pw").is_err());
        let err = EtcdUser::parse("secretpassword").unwrap_err().to_string();
        assert!(!err.contains("secretpassword"), "{err}");
        assert!(EtcdUser::parse("u:").is_ok());
    }
}
