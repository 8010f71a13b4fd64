//! etcd-client's errors as one line for an operator, shared by connecting
//! (`connect.rs`) and the endpoint probes (`health.rs`): the root cause
//! instead of tonic's struct dump, and for TLS which check failed and what
//! to change. Nothing here formats a password or key: the words come from
//! etcd-client's errors, which carry neither (docs/etcd-notes.md, "TLS and
//! auth failures"), and from our own.

use crate::tls::refusal::{self, ClientSide};
use crate::tls::Tls;
use etcd_client as ec;

/// Whether `e` is a gRPC status with `code`.
pub(crate) fn is_status(e: &ec::Error, code: tonic::Code) -> bool {
    matches!(e, ec::Error::GRpcStatus(s) if s.code() == code)
}

/// One line saying what failed; TLS failures say which check failed and
/// what to change. The certificate checks are told apart by rustls's words
/// at the root of the error chain (docs/etcd-notes.md, "TLS and auth
/// failures": they all arrive as `Unavailable`, like a network failure).
pub(crate) fn explain(e: &ec::Error, tls: Option<&Tls>) -> String {
    let root = connect_reason(e);
    if let Some(foreign) = foreign_protocol(&root) {
        return foreign;
    }
    let Some(tls) = tls else {
        return root;
    };
    if refusal::untrusted_server(&root) {
        return format!("TLS: the server's certificate is not signed by the given CA ({root})");
    }
    if refusal::wrong_name(&root) {
        return format!(
            "TLS: the server's certificate is not valid for the name dialled; \
             dial a name it was issued for or set the TLS server name ({root})"
        );
    }
    let alert = refusal::refused_by_alert(&root);
    // Without an alert the client sees only the server hanging up, in one
    // of several words depending on where its request was (measured: the
    // shapes vary from run to run against the same server).
    let closed = is_status(e, tonic::Code::Cancelled)
        || [
            "transport error",
            "connection closed",
            "broken pipe",
            "connection reset",
        ]
        .iter()
        .any(|w| root.contains(w));
    if !(alert || closed) {
        return root;
    }
    let invalid_now = || tls.client_cert_invalid_at(refusal::unix_now());
    match refusal::client_side(tls.has_client_identity(), invalid_now) {
        ClientSide::Missing => format!(
            "TLS: the server closed the connection right after the handshake; it most \
             likely requires a client certificate, and none was given (--cert/--key) ({root})"
        ),
        ClientSide::Invalid(why) => {
            format!("TLS: the server refused the client certificate: {why} ({root})")
        }
        ClientSide::Refused => format!(
            "TLS: the server closed the connection right after the handshake; it most \
             likely refused the client certificate (is it signed by a CA the server \
             trusts?) ({root})"
        ),
    }
}

/// The words of a client that got an answer in another protocol: h2
/// reads the first bytes of an HTTP/1 reply, a Redis error or a TLS
/// record as a frame header whose length is absurd (`frame with invalid
/// size`) or whose type makes no sense (`unspecific protocol error`);
/// rustls, dialling TLS, reads a plain-text answer as a record of no known
/// type (`InvalidContentType`, `corrupt message`).
/// A plain-text server hangs up on a TLS client during the handshake
/// (`tls handshake eof`: etcd's plain port does).
const FOREIGN_PROTOCOL: [&str; 5] = [
    "frame with invalid size",
    "unspecific protocol error",
    "InvalidContentType",
    "corrupt message",
    "tls handshake eof",
];

/// What [`foreign_protocol`] says, with what answered and the cause.
fn not_etcd(what: &str, root: &str) -> String {
    format!(
        "not an etcd server (or a TLS mismatch): {what}; check the port, and use \
         https:// with --cacert exactly when etcd serves TLS ({root})"
    )
}

/// Words of a plain-text client whose server hung up on it: an HTTP/1
/// server (and a TLS port, which answers plain text with an HTTP/1 400)
/// often answers and closes before h2 has read the answer, so the client
/// sees only the hang-up. Worth a [`greeting`] to tell.
pub(crate) fn hung_up(root: &str) -> bool {
    ["broken pipe", "connection reset", "connection closed"]
        .iter()
        .any(|w| root.contains(w))
}

/// The HTTP/2 client preface and an empty SETTINGS frame: what a gRPC
/// client sends first, and what an etcd member answers with a SETTINGS
/// frame of its own.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Sends [`PREFACE`] to `address` (`host:port`) on a connection of its own
/// and reads the first bytes of the answer, within `within`: empty when
/// the server closed the connection without a byte, `None` when there was
/// no connection or no answer in time (nothing to tell by).
pub(crate) async fn greeting(address: &str, within: std::time::Duration) -> Option<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        stream.write_all(PREFACE).await.ok()?;
        let mut first = vec![0u8; 16];
        let n = stream.read(&mut first).await.ok()?;
        first.truncate(n);
        Some(first)
    };
    tokio::time::timeout(within, exchange).await.ok().flatten()
}

/// `Some(message)` when `first`, the first bytes a server answered
/// [`PREFACE`] with, are not an HTTP/2 server's (a frame whose type is
/// SETTINGS, 0x4, in its fourth byte), or when it closed the connection
/// without a byte (a TLS port does, and a TCP proxy whose etcd is down;
/// an etcd member never); `root` is the failure it explains.
pub(crate) fn foreign_greeting(first: &[u8], root: &str) -> Option<String> {
    let what = match first {
        [] => {
            "the server closed the connection without answering HTTP/2 (as a TLS port \
             does, or a TCP proxy with no etcd behind it)"
        }
        [_, _, _, 0x04, ..] => return None,
        [b'H', b'T', b'T', b'P', b'/', ..] => {
            "an HTTP/1 server answered (as a TLS port answers plain text)"
        }
        [0x15, 0x03, ..] => "a TLS server answered with an alert",
        [b'-' | b'+', ..] => "a Redis-like server answered",
        _ => "something answered in another protocol",
    };
    Some(not_etcd(what, root))
}

/// `Some(message)` when `root` says the endpoint answered in another
/// protocol: something else listens there (an HTTP/1 or Redis server, a
/// peer port), or one side speaks TLS and the other does not. Said so in
/// words an operator acts on; the caller's message names the endpoint.
fn foreign_protocol(root: &str) -> Option<String> {
    FOREIGN_PROTOCOL
        .iter()
        .any(|w| root.contains(w))
        .then(|| not_etcd("the answer is not gRPC over HTTP/2", root))
}

/// Why connecting failed, as one line for an operator. The Display of
/// etcd-client's error embeds tonic's `Status`, whose Display appends its
/// cause with `{:?}` — a struct dump. The root cause of the `source()`
/// chain says it plainly ("connection refused", a DNS failure), so that is
/// what the message carries.
fn connect_reason(e: &ec::Error) -> String {
    use std::error::Error as _;
    let reason = match e {
        ec::Error::GRpcStatus(status) => match status.source() {
            Some(cause) => root_cause(cause),
            // etcd (or something at that address) answered with a status.
            None if !status.message().is_empty() => status.message().to_string(),
            None => status.code().to_string(),
        },
        ec::Error::TransportError(t) => root_cause(t),
        ec::Error::IoError(io) => root_cause(io),
        other => other.to_string(),
    };
    // Display impls may still contain line breaks; the message is one line.
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The Display of the innermost error, in the lowercase style of the rest
/// of the message: an OS error's "(os error N)" suffix is dropped, since
/// the text before it says the same.
fn root_cause(mut e: &(dyn std::error::Error + 'static)) -> String {
    while let Some(next) = e.source() {
        e = next;
    }
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    };
    // "Connection refused" reads "connection refused"; "DNS ..." stays.
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(text.chars().skip(1)).collect()
        }
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::foreign_protocol;

    #[test]
    fn a_foreign_protocol_is_named_as_such() {
        // As measured: an HTTP/1 server and a Redis server on the port.
        for root in [
            "connection error detected: frame with invalid size",
            "connection error detected: unspecific protocol error detected",
            "received corrupt message of type InvalidContentType",
        ] {
            let said = foreign_protocol(root).expect(root);
            assert!(
                said.starts_with("not an etcd server (or a TLS mismatch)"),
                "{said}"
            );
            assert!(said.contains(root), "the cause stays: {said}");
        }
    }

    #[test]
    fn a_greeting_tells_etcd_from_the_rest() {
        use super::foreign_greeting;
        let root = "stream closed because of a broken pipe";
        // etcd's SETTINGS frame: length 0x12, type 4.
        assert_eq!(
            foreign_greeting(&[0, 0, 0x12, 4, 0, 0, 0, 0, 0], root),
            None
        );
        for (first, who) in [
            (&[][..], "a TLS port"),
            (&b"HTTP/1.0 400 Bad Request"[..], "HTTP/1"),
            (&[0x15, 0x03, 0x01, 0x00, 0x02][..], "TLS"),
            (&b"-ERR unknown command"[..], "Redis"),
            (&b"SSH-2.0-OpenSSH"[..], "another protocol"),
        ] {
            let said = foreign_greeting(first, root).expect(who);
            assert!(
                said.starts_with("not an etcd server (or a TLS mismatch)"),
                "{said}"
            );
            assert!(said.contains(who) && said.contains(root), "{said}");
        }
    }

    #[test]
    fn network_failures_are_not_a_foreign_protocol() {
        for root in [
            "connection refused",
            "transport error",
            "deadline has elapsed",
            "dns error: failed to lookup address information",
        ] {
            assert_eq!(foreign_protocol(root), None, "{root}");
        }
    }
}
