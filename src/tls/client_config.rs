//! A rustls `ClientConfig` from a [`Tls`], for clients that take one
//! instead of file paths (async-nats): the CA bundle is the only trust
//! anchor (no platform roots), the client identity is presented when set,
//! and a configured server name replaces the dialled host in the
//! certificate check.
//!
//! The crypto provider is ring, named explicitly: the process-wide default
//! is only chosen automatically when exactly one provider is compiled in,
//! and an application could add another (aws-lc-rs) through its own
//! dependencies.

use super::Tls;
use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;

impl Tls {
    /// The rustls configuration of this TLS. [`Error::InvalidArgument`] when
    /// a CA certificate is not one rustls can use as a trust anchor, or when
    /// the client key does not match its certificate (the message names the
    /// setting, never the key).
    pub(crate) fn to_rustls(&self) -> Result<ClientConfig> {
        let provider = Arc::new(super::provider::ring());
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca) {
            let cert = cert.map_err(|_| Error::invalid("ca", "the CA bundle is not valid PEM"))?;
            roots.add(cert).map_err(|e| {
                Error::invalid("ca", format!("a CA certificate is not usable: {e}"))
            })?;
        }
        let roots = Arc::new(roots);
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::invalid("tls", format!("no TLS version available: {e}")))?;
        let builder = match &self.server_name {
            None => builder.with_root_certificates(roots),
            Some(name) => {
                let expected = ServerName::try_from(name.clone()).map_err(|_| {
                    Error::invalid(
                        "server_name",
                        format!("{name:?} is not a host name or IP address"),
                    )
                })?;
                let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| Error::invalid("ca", format!("unusable CA bundle: {e}")))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(NamedVerifier { inner, expected }))
            }
        };
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some(identity) => {
                let certs = CertificateDer::pem_slice_iter(&identity.cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|_| {
                        Error::invalid("client_cert", "the client certificate is not valid PEM")
                    })?;
                let key = PrivateKeyDer::from_pem_slice(identity.key.expose()).map_err(|_| {
                    Error::invalid(
                        "client_key",
                        "the client key holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                    )
                })?;
                // rustls's error could describe the key; it is not quoted.
                builder.with_client_auth_cert(certs, key).map_err(|_| {
                    Error::invalid(
                        "client_key",
                        "the client key is not one rustls can sign with, or does not \
                         belong to the client certificate",
                    )
                })
            }
        }
    }
}

/// The WebPKI check with the configured server name in place of the
/// dialled host: every other part of the verification (chain, validity,
/// signatures) is the inner verifier's.
#[derive(Debug)]
struct NamedVerifier {
    inner: Arc<WebPkiServerVerifier>,
    expected: ServerName<'static>,
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.inner.verify_server_cert(
            end_entity,
            intermediates,
            &self.expected,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use crate::testing::{ServerNames, TestPki};

    #[test]
    fn builds_with_and_without_identity_and_name() {
        let pki = TestPki::generate_for(ServerNames::LocalhostOnly).unwrap();
        let plain = crate::Tls::from_ca_file(pki.ca_path()).unwrap();
        assert!(plain.to_rustls().is_ok());
        let full = pki
            .client_tls()
            .unwrap()
            .with_server_name("localhost")
            .unwrap();
        assert!(full.to_rustls().is_ok());
        // A key of another certificate is refused before dialling.
        let other = TestPki::generate().unwrap();
        let cert = std::fs::read(pki.client_cert_path()).unwrap();
        let key = std::fs::read(other.client_key_path()).unwrap();
        let mismatched = plain.clone().with_client_identity(cert, key).unwrap();
        let err = mismatched.to_rustls().unwrap_err().to_string();
        assert!(err.contains("client_key"), "{err}");
        assert!(!err.contains("PRIVATE"), "{err}");
    }
}
