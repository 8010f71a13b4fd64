//! TLS for Redis: certificates in the crate's form, the crypto provider
//! its handshakes need, and failed handshakes explained in one line.

use super::target::Target;
use crate::error::one_line;
use crate::tls::refusal::{self, ClientSide};
use crate::tls::Tls;
use redis::{ClientTlsConfig, RedisError, TlsCertificates};

impl Target {
    /// `e` in one line; on `rediss://`, a failed handshake says which check
    /// failed and what to change, told apart by rustls's words in the
    /// crate's message (a handshake failure arrives as an I/O error, like
    /// a network failure). `connecting`: `e` ended the first connect, where
    /// a server hanging up means it refused the handshake; later (a
    /// restart, a failover) it means nothing of the kind.
    pub(crate) fn explain(&self, e: &RedisError, connecting: bool) -> String {
        let said = one_line(e);
        if !self.secure {
            return said;
        }
        let has_identity = self.tls.as_ref().is_some_and(Tls::has_client_identity);
        explain_tls(&said, connecting, has_identity, self.tls.is_some(), || {
            self.tls
                .as_ref()
                .and_then(|t| t.client_cert_invalid_at(refusal::unix_now()))
        })
    }
}

/// The crate's form of `tls`.
pub(super) fn certificates(tls: &Tls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls
            .client_identity_pem()
            .map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.to_vec(),
                client_key: key.to_vec(),
            }),
        root_cert: Some(tls.ca_pem().to_vec()),
    }
}

/// Makes ring rustls' process-level CryptoProvider unless one is set. The
/// crate builds its TLS config with `rustls::ClientConfig::builder()`,
/// which takes that provider and panics when none is set and the
/// application's dependency graph enables more than one (ring here, and
/// aws-lc-rs from another crate). An application that installed its own
/// keeps it.
pub(super) fn install_crypto_provider(secure: bool) {
    if secure && rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one first, which serves as well.
        let _ = crate::tls::provider::ring().install_default();
    }
}

/// [`Target::explain`] on the crate's one-line message `said`:
/// `connecting` whether it ended the first connect, `has_identity` whether
/// a client certificate was given, `has_ca` whether a CA was (else the
/// built-in roots verify), `cert_invalid` why the client certificate is not
/// valid now, if it is not.
fn explain_tls(
    said: &str,
    connecting: bool,
    has_identity: bool,
    has_ca: bool,
    cert_invalid: impl FnOnce() -> Option<String>,
) -> String {
    if refusal::untrusted_server(said) {
        let ca = if has_ca {
            "the given CA (RedisOptions::with_tls)"
        } else {
            "a public CA, and no CA was given (RedisOptions::with_tls)"
        };
        return format!(
            "TLS: the server's certificate is not trusted: it is not signed by {ca} ({said})"
        );
    }
    if refusal::wrong_name(said) {
        return format!(
            "TLS: the server's certificate is not valid for the host in the URL; use a host \
             name or address it was issued for ({said})"
        );
    }
    // rustls says "invalid peer certificate: …" of the server's certificate
    // and "received fatal alert: …" when the server refused the client's.
    let alert = said.contains("received fatal alert") || said.contains("certificate required");
    if !alert && (said.contains("Expired") || said.contains("NotValidYet")) {
        return format!("TLS: the server's certificate is outside its validity dates ({said})");
    }
    // A server that wants a client certificate aborts the handshake with an
    // alert, or (TLS 1.3, where the client finishes first) hangs up right
    // after it; the client then sees a reset or an early end of file.
    let closed = connecting
        && [
            "connection reset",
            "Connection reset",
            "broken pipe",
            "Broken pipe",
            "unexpected end of file",
            "UnexpectedEof",
            "peer closed connection",
        ]
        .iter()
        .any(|w| said.contains(w));
    if !(alert || closed) {
        return said.to_string();
    }
    match refusal::client_side(has_identity, cert_invalid) {
        ClientSide::Missing => format!(
            "TLS: the server closed the connection during the handshake; it most likely \
             requires a client certificate (tls-auth-clients), and none was given \
             (Tls::with_client_files) ({said})"
        ),
        ClientSide::Invalid(why) => {
            format!("TLS: the server refused the client certificate: {why} ({said})")
        }
        // A hang-up alone, with a valid certificate given, is no verdict
        // on it: the crate's own words say more.
        ClientSide::Refused if !alert => said.to_string(),
        ClientSide::Refused => format!(
            "TLS: the server refused the client certificate (is it signed by a CA the \
             server trusts?) ({said})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_handshakes_say_which_check_failed() {
        let none = || None;
        let said = "cannot connect: invalid peer certificate: UnknownIssuer";
        let text = explain_tls(said, true, false, true, none);
        assert!(
            text.starts_with(
                "TLS: the server's certificate is not trusted: it is not signed by the given CA"
            ),
            "{text}"
        );
        assert!(explain_tls(said, true, false, false, none).contains("no CA was given"));
        let text = explain_tls(
            "invalid peer certificate: NotValidForName",
            true,
            false,
            true,
            none,
        );
        assert!(text.contains("not valid for the host in the URL"), "{text}");
        let reset = "Connection reset by peer";
        assert!(
            explain_tls(reset, true, false, true, none).contains("requires a client certificate")
        );
        let alert = "received fatal alert: CertificateRequired";
        assert!(
            explain_tls(alert, true, false, true, none).contains("requires a client certificate")
        );
        let text = explain_tls("invalid peer certificate: Expired", true, true, true, none);
        assert!(
            text.contains("the server's certificate is outside its validity dates"),
            "{text}"
        );
        let expired = || Some("it expired on 2021-01-01 00:00:00 UTC".to_string());
        assert_eq!(
            explain_tls(
                "received fatal alert: CertificateExpired",
                true,
                true,
                true,
                expired
            ),
            "TLS: the server refused the client certificate: it expired on 2021-01-01 \
             00:00:00 UTC (received fatal alert: CertificateExpired)"
        );
        assert_eq!(
            explain_tls("connection refused", true, true, true, none),
            "connection refused"
        );
        // Past the first connect a reset is a restart or a failover, not a
        // refused handshake.
        assert_eq!(explain_tls(reset, false, false, true, none), reset);
    }
}
