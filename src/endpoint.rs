//! Endpoint strings, parsed strictly before anything is dialled.
//!
//! etcd-client takes URLs and fills in what is missing: a port it cannot
//! read becomes port 80, so `127.0.0.1:99999` used to dial
//! `127.0.0.1:80`. Parsing here first means a typo is an
//! `InvalidArgument` naming the endpoint, never a connection somewhere
//! else.

use std::net::{Ipv4Addr, Ipv6Addr};

/// `raw` (`host:port`, `http://host:port` or `https://host:port`,
/// surrounding whitespace ignored) as the URL the driver dials: `https://`
/// when `tls` is set, else `http://`; or why it is not an endpoint, phrased
/// to follow the endpoint itself.
///
/// The host is a DNS name (labels of letters, digits and inner hyphens),
/// a dotted-quad IPv4 address, or an IPv6 address in brackets; the port
/// is 1..=65535 and required. No user name, path, query or fragment. A
/// scheme that contradicts `tls` is refused rather than dialled: etcd-client
/// would otherwise use TLS without our CA, or no TLS at all.
pub(crate) fn parse(raw: &str, tls: bool) -> Result<String, String> {
    let text = raw.trim();
    if text.is_empty() {
        return Err("is empty; expected host:port".into());
    }
    let authority = match text.split_once("://") {
        None => text,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => {
            if tls {
                return Err(
                    "is plain http:// but TLS is configured; use https://host:port or host:port"
                        .into(),
                );
            }
            rest
        }
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => {
            if !tls {
                return Err("is https:// but no TLS is configured; give the CA \
                     (EtcdOptions::with_tls, --cacert)"
                    .into());
            }
            rest
        }
        Some((scheme, _)) => {
            return Err(format!(
                "the scheme {scheme:?} is not supported; use host:port, http://host:port \
                 or https://host:port"
            ));
        }
    };
    if let Some(c) = authority
        .chars()
        .find(|c| matches!(c, '/' | '?' | '#' | '@') || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "contains {c:?}; an endpoint is only host:port (no user, path or query)"
        ));
    }
    let (host, port) = split_host_port(authority)?;
    let port = parse_port(port)?;
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{host}:{port}"))
}

/// `host` and the text after its `:`; a bracketed IPv6 host keeps its
/// brackets.
fn split_host_port(authority: &str) -> Result<(&str, &str), String> {
    if let Some(rest) = authority.strip_prefix('[') {
        let Some((inner, after)) = rest.split_once(']') else {
            return Err("has '[' without a closing ']'".into());
        };
        if inner.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{inner:?} is not an IPv6 address"));
        }
        let Some(port) = after.strip_prefix(':') else {
            return Err("has no port; expected [ipv6]:port".into());
        };
        return Ok((&authority[..inner.len() + 2], port));
    }
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Err("has no port; expected host:port".into());
    };
    if host.contains(':') {
        return Err("has more than one ':'; an IPv6 address goes in brackets, [::1]:2379".into());
    }
    check_host(host)?;
    Ok((host, port))
}

/// A DNS name or an IPv4 address. A host of digits and dots only must be a
/// full dotted quad: resolvers read `127.1` as an address, not a name.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("has no host; expected host:port".into());
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return match host.parse::<Ipv4Addr>() {
            Ok(_) => Ok(()),
            Err(_) => Err(format!("{host:?} is not an IPv4 address")),
        };
    }
    let valid_label = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if host.len() > 253 || !host.split('.').all(valid_label) {
        return Err(format!(
            "{host:?} is not a host name (letters, digits, '-' and '.'), \
             an IPv4 address or a bracketed IPv6 address"
        ));
    }
    Ok(())
}

/// 1..=65535, digits only (no sign).
fn parse_port(port: &str) -> Result<u16, String> {
    if port.is_empty() {
        return Err("has no port after ':'".into());
    }
    let number = if port.bytes().all(|b| b.is_ascii_digit()) {
        port.parse::<u16>().ok()
    } else {
        None
    };
    match number {
        Some(0) | None => Err(format!("{port:?} is not a port (1-65535)")),
        Some(n) => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;
    use proptest::prelude::*;

    #[test]
    fn accepts_names_addresses_and_the_http_scheme() {
        for (raw, url) in [
            ("127.0.0.1:2379", "http://127.0.0.1:2379"),
            ("http://127.0.0.1:2379", "http://127.0.0.1:2379"),
            ("HTTP://localhost:1", "http://localhost:1"),
            (" localhost:65535 ", "http://localhost:65535"),
            ("[::1]:2379", "http://[::1]:2379"),
            ("http://[fd00::1]:2379", "http://[fd00::1]:2379"),
            ("etcd-0.etcd.svc:2379", "http://etcd-0.etcd.svc:2379"),
            ("node1:02379", "http://node1:2379"),
        ] {
            assert_eq!(parse(raw, false).as_deref(), Ok(url), "{raw:?}");
            let tls = url.replacen("http://", "https://", 1);
            let raw_tls = raw
                .replacen("http://", "https://", 1)
                .replacen("HTTP://", "https://", 1);
            assert_eq!(parse(&raw_tls, true), Ok(tls), "{raw_tls:?}");
        }
    }

    #[test]
    fn the_scheme_must_agree_with_the_tls_setting() {
        assert_eq!(
            parse("HTTPS://127.0.0.1:2379", true).as_deref(),
            Ok("https://127.0.0.1:2379")
        );
        let no_ca = parse("https://127.0.0.1:2379", false).unwrap_err();
        assert!(no_ca.contains("no TLS is configured"), "{no_ca}");
        let plain = parse("http://127.0.0.1:2379", true).unwrap_err();
        assert!(plain.contains("TLS is configured"), "{plain}");
    }

    #[test]
    fn refuses_what_used_to_dial_port_80_or_elsewhere() {
        for raw in [
            "",
            "127.0.0.1:99999",
            "127.0.0.1:65536",
            "127.0.0.1:0",
            "127.0.0.1:-1",
            "127.0.0.1:+1",
            "localhost:notaport",
            "localhost:",
            "localhost",
            ":2379",
            "unix:///run/etcd.sock",
            "grpc://host:1",
            "http://",
            "http://host:1/",
            "http://host:1/v3",
            "host:1?x",
            "host:1#x",
            "user@host:1",
            "::1:2379",
            "[::1]",
            "[::1]:",
            "[::1:2379",
            "[not-v6]:1",
            "[fe80::1%eth0]:1",
            "127.1:2379",
            "256.0.0.1:2379",
            "01.2.3.4:2379",
            "host_name:1",
            "-host:1",
            "host-:1",
            "a..b:1",
            "host.:1",
            "ho st:1",
            "h\0st:1",
            "a:b:1",
        ] {
            for tls in [false, true] {
                assert!(
                    parse(raw, tls).is_err(),
                    "{raw:?} was accepted: {:?}",
                    parse(raw, tls)
                );
            }
        }
        let long = format!("{}:1", "a".repeat(64));
        assert!(parse(&long, false).is_err());
    }

    proptest! {
        /// Any text at all: an answer, never a panic; and whatever is
        /// accepted is a URL with a port in range that parses the same way
        /// again.
        #[test]
        fn any_text_is_parsed_or_refused(raw in any::<String>()) {
            for tls in [false, true] {
                if let Ok(url) = parse(&raw, tls) {
                    let scheme = if tls { "https://" } else { "http://" };
                    prop_assert!(url.starts_with(scheme), "{}", url);
                    let port: u16 = url.rsplit(':').next().unwrap_or_default().parse().unwrap_or(0);
                    prop_assert!(port >= 1);
                    prop_assert_eq!(parse(&url, tls), Ok(url.clone()));
                }
            }
        }

        /// Text shaped like an endpoint, with any port text.
        #[test]
        fn ports_outside_1_to_65535_are_refused(
            host in "(localhost|127\\.0\\.0\\.1|\\[::1\\]|[a-z][a-z0-9-]{0,10})",
            port in "[-+]?[0-9]{0,7}",
        ) {
            let raw = format!("{host}:{port}");
            let in_range = !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
            let host_ok = !host.ends_with('-');
            prop_assert_eq!(parse(&raw, false).is_ok(), in_range && host_ok, "{:?}", raw);
        }
    }
}
