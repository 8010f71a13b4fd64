//! Reading a refused TLS connect, the same way for every backend: by
//! rustls's words in the client library's error text. A handshake failure
//! arrives as an I/O or transport error, like a network failure
//! (docs/etcd-notes.md, "TLS and auth failures"), so the words are all
//! there is. Which words mean "the server hung up" depends on the client
//! library, and what the user should change depends on the backend: each
//! backend decides those and words its message; what rustls's words mean
//! is decided here, once.

/// rustls refused the server's certificate: no trusted CA signed it.
pub(crate) fn untrusted_server(text: &str) -> bool {
    text.contains("UnknownIssuer") || text.contains("BadSignature")
}

/// rustls refused the server's certificate: it is not valid for the name
/// dialled.
pub(crate) fn wrong_name(text: &str) -> bool {
    text.contains("NotValidForName") || text.contains("not valid for name")
}

/// The server sent an alert refusing the client's certificate (or its
/// absence). Which one depends on the server's TLS stack and version:
/// etcd 3.4 and nats-server 2.9 say `BadCertificate` for a missing or
/// expired certificate; etcd 3.5.16 and nats-server 2.15 (newer Go) say
/// `CertificateExpired` for an expired one.
pub(crate) fn refused_by_alert(text: &str) -> bool {
    [
        "CertificateRequired",
        "BadCertificate",
        "CertificateExpired",
        "CertificateUnknown",
        "UnknownCA",
        "certificate required",
    ]
    .iter()
    .any(|a| text.contains(a))
}

/// Why the server refused the handshake, on the client's side.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ClientSide {
    /// No client certificate was given: the server most likely wants one.
    Missing,
    /// The given client certificate is not valid now, and why (its dates).
    Invalid(String),
    /// The given certificate is valid now; the server did not accept it
    /// (most likely not signed by a CA it trusts).
    Refused,
}

/// The verdict once a backend has read the server aborting or hanging up
/// during the handshake. The dates are checked here, when the refusal is
/// explained: a certificate valid at startup may have expired since.
pub(crate) fn client_side(
    has_identity: bool,
    invalid_now: impl FnOnce() -> Option<String>,
) -> ClientSide {
    if !has_identity {
        return ClientSide::Missing;
    }
    match invalid_now() {
        Some(why) => ClientSide::Invalid(why),
        None => ClientSide::Refused,
    }
}

/// Seconds since the epoch now (0 for a clock before it, which makes no
/// certificate look expired).
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_words_are_read_alike_for_every_backend() {
        assert!(untrusted_server("invalid peer certificate: UnknownIssuer"));
        assert!(untrusted_server("invalid peer certificate: BadSignature"));
        assert!(!untrusted_server("invalid peer certificate: Expired"));
        assert!(wrong_name("invalid peer certificate: NotValidForName"));
        assert!(wrong_name("certificate not valid for name \"x\""));
        assert!(!wrong_name("connection reset by peer"));
        assert_eq!(client_side(false, || Some("x".into())), ClientSide::Missing);
        assert_eq!(
            client_side(true, || Some("it expired".into())),
            ClientSide::Invalid("it expired".into())
        );
        assert_eq!(client_side(true, || None), ClientSide::Refused);
        assert!(unix_now() > 1_700_000_000);
    }
}
