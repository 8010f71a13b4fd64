//! Where the Redis backend connects, checked once: the URLs and options
//! parsed into one [`Target`], passwords redacted from everything it
//! shows, and the user's errors, which name it and give every crate error
//! its [`ErrorKind`].

use super::conn::{Confirm, UNREPLICATED};
use super::options::RedisOptions;
use super::tls::certificates;
use crate::endpoints::Endpoints;
use crate::error::{Error, ErrorKind, Result};
use crate::tls::Tls;
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisError, TlsCertificates};
use std::time::Duration;

/// Where and how to connect, checked once.
#[derive(Clone)]
pub(crate) struct Target {
    /// The URLs as given (passwords removed), for messages.
    pub(crate) urls: String,
    pub(super) nodes: Vec<ConnectionInfo>,
    pub(crate) cluster: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    /// `WAIT` after each write of the command connection: replicas and
    /// milliseconds.
    pub(super) confirm: Option<Confirm>,
    /// The URLs are `rediss://`.
    pub(super) secure: bool,
    /// [`RedisOptions::tls`], for explaining failed handshakes.
    pub(super) tls: Option<Tls>,
    /// The same, in the crate's form; the client key leaves [`Tls`] only
    /// into this (the crate's `Debug` of it is redacted too).
    pub(super) certs: Option<TlsCertificates>,
}

impl Target {
    /// Checks `urls` (`redis://` or `rediss://` URLs, or `host:port`,
    /// which means `redis://host:port`, or `rediss://host:port` when
    /// `options` configure TLS) and `options`.
    pub(crate) fn parse(
        urls: &(impl Endpoints + ?Sized),
        options: &RedisOptions,
    ) -> Result<Target> {
        options.check()?;
        let list = urls
            .endpoint_list()
            .iter()
            .map(|u| with_scheme(u, options.tls.is_some()))
            .collect::<Result<Vec<String>>>()?;
        if list.is_empty() {
            return Err(Error::invalid("url", "no redis:// URL given"));
        }
        let secure = list.iter().any(|u| u.starts_with("rediss://"));
        let mut nodes = Vec::with_capacity(list.len());
        let mut shown = Vec::with_capacity(list.len());
        for url in &list {
            let url = url.as_str();
            let tls_url = url.starts_with("rediss://");
            if !tls_url && !url.starts_with("redis://") {
                return Err(Error::invalid(
                    "url",
                    format!("{:?} is not a redis:// or rediss:// URL", redacted(url)),
                ));
            }
            if tls_url != secure {
                return Err(Error::invalid(
                    "url",
                    "mixes redis:// and rediss:// URLs; every node takes the same one",
                ));
            }
            if !tls_url && options.tls.is_some() {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "{:?} is plain redis:// but TLS is configured; use rediss://",
                        redacted(url)
                    ),
                ));
            }
            // The crate reads `#insecure` as "skip the host name check".
            if url.contains('#') {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "{:?} has a #fragment; none is taken (the server's certificate is \
                         always verified, so #insecure is refused)",
                        redacted(url)
                    ),
                ));
            }
            let info = url
                .into_connection_info()
                .map_err(|e| Error::invalid("url", format!("{:?}: {e}", redacted(url))))?;
            let mut settings = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            if let Some(user) = &options.username {
                settings = settings.set_username(user);
            }
            if let Some(password) = &options.password {
                settings = settings.set_password(password);
            }
            nodes.push(info.set_redis_settings(settings));
            shown.push(redacted(url));
        }
        let cluster = options.cluster.unwrap_or(nodes.len() > 1);
        if !cluster && nodes.len() > 1 {
            return Err(Error::invalid(
                "url",
                "several URLs name a cluster; standalone takes exactly one",
            ));
        }
        Ok(Target {
            urls: shown.join(","),
            nodes,
            cluster,
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
            confirm: options.min_replicas.map(|replicas| Confirm {
                replicas,
                // `check` bounds it to at least 1 ms and at most 24 h.
                timeout_ms: u64::try_from(options.min_replicas_timeout.as_millis())
                    .unwrap_or(u64::MAX),
            }),
            secure,
            tls: options.tls.clone(),
            certs: options.tls.as_ref().map(certificates),
        })
    }

    /// `e` as the user's error, with what was being done.
    pub(crate) fn error(&self, context: impl std::fmt::Display, e: &RedisError) -> Error {
        let kind = kind_of(e);
        let said = match (kind, e.detail()) {
            // Our own error: its detail is the whole story, its code noise.
            (ErrorKind::Unreplicated, Some(detail)) => detail.to_string(),
            _ => self.explain(e, false),
        };
        Error::Backend {
            backend: "redis",
            endpoints: self.urls.clone(),
            kind,
            message: format!("{context}: {said}"),
        }
    }

    /// An error of `kind` that did not come from the crate.
    pub(crate) fn failure(&self, kind: ErrorKind, message: impl Into<String>) -> Error {
        Error::Backend {
            backend: "redis",
            endpoints: self.urls.clone(),
            kind,
            message: message.into(),
        }
    }
}

/// How the policy of [`Error::is_retryable`] sees a crate error.
pub(super) fn kind_of(e: &RedisError) -> ErrorKind {
    use redis::{ErrorKind as RedisErrorKind, ServerErrorKind};
    if e.kind() == RedisErrorKind::Extension && e.code() == Some(UNREPLICATED) {
        return ErrorKind::Unreplicated;
    }
    // Codes the crate has no kind for: a refused login (`HELLO 3 AUTH`
    // answers `WRONGPASS` for a wrong password or a disabled user) and a
    // server that wants one (`NOAUTH`).
    if matches!(e.code(), Some("WRONGPASS" | "NOAUTH")) {
        return ErrorKind::PermissionDenied;
    }
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return ErrorKind::Unavailable;
    }
    match e.kind() {
        RedisErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::ReadOnly,
        )
        | RedisErrorKind::ClusterConnectionNotFound
        | RedisErrorKind::Io => ErrorKind::Unavailable,
        RedisErrorKind::Server(ServerErrorKind::NoPerm) | RedisErrorKind::AuthenticationFailed => {
            ErrorKind::PermissionDenied
        }
        RedisErrorKind::Parse | RedisErrorKind::UnexpectedReturnType => ErrorKind::Unexpected,
        _ => ErrorKind::Rejected,
    }
}

/// `url` with the scheme `host:port` stands for: `redis://`, or
/// `rediss://` with `tls`, as etcd's and NATS' endpoints read; a URL with
/// a scheme stays as it is. `host:port` is checked as strictly as an etcd
/// endpoint (a port is required, 1..=65535).
fn with_scheme(url: &str, tls: bool) -> Result<String> {
    if url.contains("://") {
        return Ok(url.to_string());
    }
    let dialled = crate::endpoint::parse(url, false)
        .map_err(|why| Error::invalid("url", format!("{url:?} {why}")))?;
    let authority = dialled.trim_start_matches("http://");
    Ok(if tls {
        format!("rediss://{authority}")
    } else {
        format!("redis://{authority}")
    })
}

/// `url` without its password.
fn redacted(url: &str) -> String {
    // redis[s]://[user[:password]@]host...
    let Some((scheme, rest)) = ["redis://", "rediss://"]
        .iter()
        .find_map(|s| url.strip_prefix(s).map(|rest| (s, rest)))
    else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((auth, host)) => {
            let user = auth.split_once(':').map_or(auth, |(u, _)| u);
            format!("{scheme}{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::redis::test_util::server;

    fn parse(urls: &str) -> Result<Target> {
        Target::parse(urls, &RedisOptions::default())
    }

    #[test]
    fn host_port_means_redis_or_rediss_with_tls() {
        let t = parse("127.0.0.1:6379").unwrap();
        assert_eq!(t.urls, "redis://127.0.0.1:6379");
        assert!(!t.secure && !t.cluster);
        let t = parse("127.0.0.1:7000, 127.0.0.1:7001").unwrap();
        assert_eq!(t.urls, "redis://127.0.0.1:7000,redis://127.0.0.1:7001");
        let with_ca = RedisOptions::default().with_tls(Tls::new(TEST_CA).unwrap());
        let t = Target::parse(&["127.0.0.1:6379"], &with_ca).unwrap();
        assert_eq!(t.urls, "rediss://127.0.0.1:6379");
        assert!(t.secure);
        assert!(parse("127.0.0.1").is_err());
    }

    /// A CA certificate (self-signed, made once with openssl) for checks
    /// that never dial.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBdTCCARugAwIBAgIUDZAsTM3txF1EJjLXFMJxUAWpDd0wCgYIKoZIzj0EAwIw
DzENMAsGA1UEAwwEdGVzdDAgFw0yNjEyMDIxMzA3MzBaGA8yMTI2MTEwODEzMDcz
MFowDzENMAsGA1UEAwwEdGVzdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABMSJ
2coBxtnxSjJ/lCELQw0Fh8lrTfOglIV0NRuCtuBKWUk9sPtl0Pho9CG0utoRmhWV
IbJe141t/NAeUDHSZaKjUzBRMB0GA1UdDgQWBBSTe4qD0MeiEKCfdhWsx3iCzeuH
QDAfBgNVHSMEGDAWgBSTe4qD0MeiEKCfdhWsx3iCzeuHQDAPBgNVHRMBAf8EBTAD
AQH/MAoGCCqGSM49BAMCA0gAMEUCIQDNzn+GYzGusEcLgMBEQZ7LAHIQv4b9WcAE
9jUtZdU4kwIgQUUJ4slVD4FBVIOCjHIA3uSlNSNpO1wv/73IauaolWE=
-----END CERTIFICATE-----
";

    #[test]
    fn one_url_is_standalone_several_a_cluster() {
        assert!(!parse("redis://127.0.0.1:6379").unwrap().cluster);
        assert!(
            parse("redis://127.0.0.1:7000, redis://127.0.0.1:7001")
                .unwrap()
                .cluster
        );
        let forced = Target::parse(
            "redis://127.0.0.1:7000",
            &RedisOptions::default().with_cluster(true),
        )
        .unwrap();
        assert!(forced.cluster);
        assert!(Target::parse(
            "redis://127.0.0.1:7000,redis://127.0.0.1:7001",
            &RedisOptions::default().with_cluster(false),
        )
        .is_err());
    }

    #[test]
    fn bad_urls_are_named() {
        for bad in [
            "",
            " , ",
            "http://127.0.0.1:6379",
            "127.0.0.1",
            "127.0.0.1:99999",
        ] {
            match parse(bad) {
                Err(Error::InvalidArgument { what: "url", .. }) => {}
                other => panic!("{bad:?}: {:?}", other.map(|t| t.urls)),
            }
        }
    }

    #[test]
    fn rediss_urls_take_tls_and_never_skip_verification() {
        // Without a CA: TLS verified against the built-in roots.
        let t = parse("rediss://127.0.0.1:6379").unwrap();
        assert!(t.secure && t.certs.is_none());
        let t = parse("rediss://127.0.0.1:7000,rediss://127.0.0.1:7001").unwrap();
        assert!(t.secure && t.cluster);
        let tls = Tls::new(TEST_CA).unwrap();
        let with_ca = RedisOptions::default().with_tls(tls.clone());
        let t = Target::parse("rediss://127.0.0.1:6379", &with_ca).unwrap();
        let certs = t.certs.as_ref().expect("the CA is handed to the crate");
        assert_eq!(certs.root_cert.as_deref(), Some(TEST_CA.as_bytes()));
        assert!(certs.client_tls.is_none());
        for (urls, options, says) in [
            (
                "redis://127.0.0.1:6379",
                &with_ca,
                "is plain redis:// but TLS is configured",
            ),
            (
                "rediss://127.0.0.1:7000,redis://127.0.0.1:7001",
                &RedisOptions::default(),
                "mixes redis:// and rediss://",
            ),
            (
                "rediss://127.0.0.1:6379/#insecure",
                &RedisOptions::default(),
                "#insecure is refused",
            ),
        ] {
            match Target::parse(urls, options) {
                Err(Error::InvalidArgument { what: "url", why }) => {
                    assert!(why.contains(says), "{urls}: {why}")
                }
                other => panic!("{urls}: {:?}", other.map(|t| t.urls)),
            }
        }
        let named = RedisOptions::default().with_tls(tls.with_server_name("localhost").unwrap());
        assert!(matches!(
            Target::parse("rediss://127.0.0.1:6379", &named),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn messages_never_show_passwords() {
        let t = parse("redis://app:hunter2@127.0.0.1:6379").unwrap();
        assert_eq!(t.urls, "redis://app:***@127.0.0.1:6379");
        let e = t.failure(ErrorKind::Unavailable, "x").to_string();
        assert!(!e.contains("hunter2"), "{e}");
        // A user without a password, and text that is no redis:// URL, are
        // shown as they are.
        assert_eq!(
            redacted("redis://app@127.0.0.1:6379"),
            "redis://app:***@127.0.0.1:6379"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("tcp://a:b@host"), "tcp://a:b@host");
        assert_eq!(
            redacted("rediss://app:p@ss@127.0.0.1:6379"),
            "rediss://app:***@127.0.0.1:6379"
        );
        let with_options = Target::parse(
            "redis://127.0.0.1:6379",
            &RedisOptions::default()
                .with_username("fleet")
                .with_password("s3cret"),
        )
        .unwrap();
        assert_eq!(with_options.urls, "redis://127.0.0.1:6379");
        let settings = with_options.nodes[0].redis_settings();
        assert_eq!(settings.username(), Some("fleet"));
        assert_eq!(settings.password(), Some("s3cret"));
    }

    #[test]
    fn out_of_range_options_and_unparsable_urls_are_refused_before_connecting() {
        let zero = RedisOptions::default().with_feed_capacity(0);
        assert!(matches!(
            Target::parse("redis://127.0.0.1:6379", &zero),
            Err(Error::InvalidArgument { .. })
        ));
        match parse("redis://127.0.0.1:notaport") {
            Err(Error::InvalidArgument { what: "url", why }) => {
                assert!(why.contains("notaport"), "{why}")
            }
            other => panic!("{:?}", other.map(|t| t.urls)),
        }
    }

    #[test]
    fn crate_errors_map_onto_the_retry_policy() {
        use redis::{ErrorKind as RedisErrorKind, ServerErrorKind};
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let unavailable = [
            refused,
            timed_out,
            RedisError::from((RedisErrorKind::Io, "dropped")),
            RedisError::from((RedisErrorKind::ClusterConnectionNotFound, "no node")),
            server(ServerErrorKind::BusyLoading),
            server(ServerErrorKind::TryAgain),
            server(ServerErrorKind::ClusterDown),
            server(ServerErrorKind::MasterDown),
            server(ServerErrorKind::Moved),
            server(ServerErrorKind::Ask),
            server(ServerErrorKind::ReadOnly),
        ];
        for e in &unavailable {
            assert_eq!(kind_of(e), ErrorKind::Unavailable, "{e}");
        }
        for e in [
            server(ServerErrorKind::NoPerm),
            RedisError::from((RedisErrorKind::AuthenticationFailed, "WRONGPASS")),
            redis::make_extension_error("WRONGPASS".into(), Some("invalid pair".into())),
            redis::make_extension_error("NOAUTH".into(), None),
        ] {
            assert_eq!(kind_of(&e), ErrorKind::PermissionDenied, "{e}");
        }
        for e in [
            RedisError::from((RedisErrorKind::Parse, "garbled")),
            RedisError::from((RedisErrorKind::UnexpectedReturnType, "not a string")),
        ] {
            assert_eq!(kind_of(&e), ErrorKind::Unexpected, "{e}");
        }
        for e in [
            server(ServerErrorKind::ResponseError),
            server(ServerErrorKind::CrossSlot),
            server(ServerErrorKind::NoScript),
            RedisError::from((RedisErrorKind::InvalidClientConfig, "bad")),
        ] {
            assert_eq!(kind_of(&e), ErrorKind::Rejected, "{e}");
        }
        // What the user sees: the backend, the URLs, the context, one line.
        let t = parse("redis://127.0.0.1:6379").unwrap();
        let e = RedisError::from((RedisErrorKind::Io, "line one\nline  two"));
        match t.error("kv_set", &e) {
            Error::Backend {
                backend: "redis",
                endpoints,
                kind: ErrorKind::Unavailable,
                message,
            } => {
                assert_eq!(endpoints, "redis://127.0.0.1:6379");
                assert!(message.starts_with("kv_set: "), "{message}");
                assert!(
                    !message.contains('\n') && !message.contains("  "),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
