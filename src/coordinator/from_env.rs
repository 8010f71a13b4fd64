//! Picking a backend from the environment. Coordination is never on the
//! critical path: whatever goes wrong in [`from_env`] degrades to a noop
//! that says why ([`Coordinator::describe`]); [`try_from_env`] returns the
//! error instead.
//!
//! Besides `COORD` and `COORD_URL`, the `COORD_TLS_*` and `COORD_NATS_*`
//! variables of [`ConnectSettings`] apply, read the same way by every
//! entry point.

use super::{
    Coordinator, EtcdCoordinator, EtcdCoordinatorOptions, MemoryCoordinator, NoopCoordinator,
};
use crate::error::{Error, Result};
use crate::etcd::{Etcd, EtcdOptions};
use crate::tls::Tls;
use std::path::PathBuf;

/// What a connection needs besides the backend's name and URL, applied by
/// [`connect`] to whichever backend it connects: TLS, and for NATS a
/// login. Holds file paths, never a secret, so `Debug` shows no key or
/// seed.
///
/// Besides `COORD` and `COORD_URL`, the backend-neutral TLS variables
/// apply to whichever backend `COORD` selects:
///
/// | variable | meaning |
/// |---|---|
/// | `COORD_TLS_CA` | PEM file of the CA bundle that signs the servers' certificates; turns TLS on |
/// | `COORD_TLS_CERT` | PEM file of a client certificate, for servers that verify clients (needs `COORD_TLS_KEY`) |
/// | `COORD_TLS_KEY` | PEM file of that certificate's private key |
/// | `COORD_TLS_SERVER_NAME` | name to check the servers' certificates against instead of the URL's host |
///
/// NATS also logs in with one of these (the other backends ignore them):
///
/// | variable | meaning |
/// |---|---|
/// | `COORD_NATS_CREDS` | a `.creds` file (user JWT and NKey seed), for servers in operator mode |
/// | `COORD_NATS_NKEY_FILE` | a file whose first line is an NKey user seed (`SU...`) |
///
/// They are read by [`ConnectSettings::from_vars`] (TLS into one [`Tls`]);
/// a blank variable counts as unset.
///
/// `#[non_exhaustive]`: more settings may follow; start from
/// [`ConnectSettings::default`] (no TLS) or [`ConnectSettings::from_vars`].
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use fleetcoord::coordinator::ConnectSettings;
///
/// // Nothing set: no TLS.
/// let settings = ConnectSettings::from_vars(|_| None)?;
/// assert!(settings.tls.is_none());
/// // A client certificate without the CA that verifies the servers is refused.
/// let half = ConnectSettings::from_vars(|name| {
///     (name == "COORD_TLS_CERT").then(|| "client.pem".to_string())
/// });
/// assert!(half.unwrap_err().to_string().contains("COORD_TLS_CA"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ConnectSettings {
    /// TLS for the backend's servers (`COORD_TLS_*`). Default `None`: the
    /// backend's plain-text default, unless its URL asks for TLS.
    pub tls: Option<Tls>,
    /// NATS: the `.creds` file to log in with (`COORD_NATS_CREDS`), read
    /// when connecting. Default `None`.
    pub nats_creds: Option<PathBuf>,
    /// NATS: a file whose first line is the NKey user seed to log in with
    /// (`COORD_NATS_NKEY_FILE`), read when connecting. Default `None`.
    pub nats_nkey_file: Option<PathBuf>,
}

impl ConnectSettings {
    /// These settings with `tls`.
    #[must_use]
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// These settings logging in to NATS with the `.creds` file at `path`.
    #[must_use]
    pub fn with_nats_creds(mut self, path: impl Into<PathBuf>) -> Self {
        self.nats_creds = Some(path.into());
        self
    }

    /// These settings logging in to NATS with the NKey seed in the file at
    /// `path`.
    #[must_use]
    pub fn with_nats_nkey_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.nats_nkey_file = Some(path.into());
        self
    }

    /// The settings the `COORD_TLS_*` and `COORD_NATS_*` variables (see
    /// [`ConnectSettings`]) ask for, looked up through `var`
    /// (`std::env::var(name).ok()` for the environment); blank values
    /// count as unset.
    ///
    /// [`Error::InvalidArgument`] naming the variable when a client
    /// certificate or key or a server name comes without `COORD_TLS_CA`,
    /// when only one of `COORD_TLS_CERT` and `COORD_TLS_KEY` is set, when
    /// both `COORD_NATS_CREDS` and `COORD_NATS_NKEY_FILE` are set, or
    /// when a TLS file cannot be read or holds no PEM of its kind (the
    /// error names the file and never quotes a key). NATS files are read
    /// when connecting.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<ConnectSettings> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let path = |name: &str| get(name).map(PathBuf::from);
        let mut settings = ConnectSettings {
            nats_creds: path("COORD_NATS_CREDS"),
            nats_nkey_file: path("COORD_NATS_NKEY_FILE"),
            ..ConnectSettings::default()
        };
        if settings.nats_creds.is_some() && settings.nats_nkey_file.is_some() {
            return Err(Error::invalid(
                "COORD_NATS_CREDS",
                "COORD_NATS_CREDS and COORD_NATS_NKEY_FILE are two ways to log in; set one",
            ));
        }
        let (ca, cert, key) = (
            path("COORD_TLS_CA"),
            path("COORD_TLS_CERT"),
            path("COORD_TLS_KEY"),
        );
        let server_name = get("COORD_TLS_SERVER_NAME");
        let Some(ca) = ca else {
            if cert.is_some() || key.is_some() || server_name.is_some() {
                return Err(Error::invalid(
                    "COORD_TLS_CA",
                    "COORD_TLS_CERT, COORD_TLS_KEY and COORD_TLS_SERVER_NAME need \
                     COORD_TLS_CA, the CA bundle that signs the servers' certificates",
                ));
            }
            return Ok(settings);
        };
        let mut tls = Tls::from_ca_file(ca)?;
        tls = match (cert, key) {
            (None, None) => tls,
            (Some(cert), Some(key)) => tls.with_client_files(cert, key)?,
            (Some(_), None) => {
                return Err(Error::invalid(
                    "COORD_TLS_KEY",
                    "COORD_TLS_CERT needs COORD_TLS_KEY, the client certificate's key",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "COORD_TLS_CERT",
                    "COORD_TLS_KEY needs COORD_TLS_CERT, the client certificate",
                ))
            }
        };
        if let Some(name) = server_name {
            tls = tls.with_server_name(name.trim())?;
        }
        settings.tls = Some(tls);
        Ok(settings)
    }
}

/// Where the etcd backend connects when `COORD_URL` is unset (and where
/// the CLI's `--endpoints` points by default): the local member.
pub const DEFAULT_ETCD_ENDPOINT: &str = "127.0.0.1:2379";

/// The backend the environment names, or the error that kept it from
/// being used; never a fallback.
///
/// `COORD` names the backend (`etcd`, `nats`, `redis`, `memory`, `noop`;
/// case-insensitive); **unset or blank means `etcd`**, the same default as
/// the CLI: fleetcoord coordinates processes across hosts, which an
/// in-process memory bus cannot. `COORD_URL` is the backend's
/// comma-separated server list (unset: its local default, e.g.
/// [`DEFAULT_ETCD_ENDPOINT`]); the `COORD_TLS_*` and `COORD_NATS_*`
/// variables are read by [`ConnectSettings::from_vars`] for every backend.
///
/// Fails with [`Error::InvalidArgument`] for an unknown `COORD` or
/// unusable `COORD_TLS_*`/`COORD_NATS_*` settings, [`Error::Unsupported`]
/// for a backend whose cargo feature is off, and the backend's error
/// ([`Error::Connect`], ...) when connecting fails.
pub fn try_from_env() -> Result<Box<dyn Coordinator>> {
    try_from_vars(env_var, None)
}

/// [`try_from_env`], falling back to a [`NoopCoordinator`] instead of
/// failing: coordination is never on the critical path, so an outage of
/// the bus never stops (or stalls past the connect timeout) the caller.
/// The fallback is not silent: it logs one warning through `log`, and,
/// with no logger installed, still says what it is and why —
/// [`Coordinator::describe`] reads `noop (fallback: <the error>)` and
/// [`NoopCoordinator::fallback_reason`] returns the error's text.
///
/// ```
/// use fleetcoord::coordinator::from_vars;
///
/// // Nothing listens on port 1.
/// let vars = |name: &str| match name {
///     "COORD" => Some("etcd".to_string()),
///     "COORD_URL" => Some("127.0.0.1:1".to_string()),
///     _ => None,
/// };
/// let coord = from_vars(vars, None);
/// assert!(coord.describe().starts_with("noop (fallback: cannot connect to etcd at http://127.0.0.1:1"));
/// coord.kv_set("config", "mode", b"on")?; // accepted, goes nowhere
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub fn from_env() -> Box<dyn Coordinator> {
    from_vars(env_var, None)
}

/// [`try_from_env`] with every variable looked up through `var` instead of
/// the environment (`std::env::var(name).ok()` is the environment), for
/// tests and for configuration that does not come from the environment;
/// and, with `etcd`, for a process that already has an [`Etcd`] handle:
/// the etcd backend (`COORD=etcd` or unset) is then an [`EtcdCoordinator`]
/// on that handle, so the process keeps one etcd connection and one driver
/// thread. `COORD_URL` is then not used for etcd, nor is the TLS the
/// variables describe (the handle has its own; the variables are still
/// read and checked, as by every entry point, so a broken setting is
/// reported whichever backend runs), and no connection attempt can fail;
/// every other backend behaves exactly as without a handle.
///
/// The coordinator holds a clone of `etcd`, so the connection stays up
/// while either is in use; closing the coordinator does not close `etcd`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::coordinator::try_from_vars;
/// use fleetcoord::Etcd;
///
/// let etcd = Etcd::connect(&server.endpoint())?;
/// // COORD unset: etcd, here on the handle the process already has.
/// let coord = try_from_vars(|name| std::env::var(name).ok(), Some(&etcd))?;
/// coord.kv_set("config", "rollout", b"50%")?;
/// # Ok(()) }
/// ```
pub fn try_from_vars(
    var: impl Fn(&str) -> Option<String>,
    etcd: Option<&Etcd>,
) -> Result<Box<dyn Coordinator>> {
    let nonblank = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let backend = nonblank("COORD").unwrap_or_else(|| "etcd".into());
    let url = nonblank("COORD_URL");
    let settings = ConnectSettings::from_vars(&var)?;
    let backend = backend.trim().to_ascii_lowercase();
    match (backend.as_str(), etcd) {
        ("etcd", Some(etcd)) => Ok(Box::new(EtcdCoordinator::on_etcd(etcd)?)),
        _ => connect(&backend, url.as_deref(), &settings),
    }
}

/// [`try_from_vars`], falling back to a self-describing
/// [`NoopCoordinator`] as [`from_env`] does.
pub fn from_vars(
    var: impl Fn(&str) -> Option<String>,
    etcd: Option<&Etcd>,
) -> Box<dyn Coordinator> {
    let url = var("COORD_URL").filter(|v| !v.trim().is_empty());
    let backend = var("COORD").filter(|v| !v.trim().is_empty());
    match try_from_vars(&var, etcd) {
        Ok(coordinator) => coordinator,
        Err(e) => {
            let reason = fallback_reason(backend.as_deref(), url.as_deref(), &e);
            log::warn!("coordination is disabled (noop): {reason}");
            Box::new(NoopCoordinator::fallback(reason))
        }
    }
}

/// Why the environment's backend could not be used, in one line that
/// names `COORD` and the URL once: the error's own text when it names the
/// URL already (a failed connect does), else with `COORD_URL` added.
fn fallback_reason(backend: Option<&str>, url: Option<&str>, e: &Error) -> String {
    let text = e.to_string();
    let named = match backend {
        Some(b) => format!("COORD={}", b.trim().to_ascii_lowercase()),
        None => "COORD unset (etcd)".to_string(),
    };
    match url.map(str::trim) {
        Some(url) if !text.contains(url) => format!("{text} ({named}, COORD_URL={url})"),
        _ => format!("{text} ({named})"),
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Connects the backend named `backend` (`memory`, `noop`, `etcd`, `nats`,
/// `redis`; case-insensitive) to `url`, the backend's comma-separated
/// server list (`None` or blank: the backend's local default, e.g.
/// [`DEFAULT_ETCD_ENDPOINT`] for etcd), with `settings` (TLS, a NATS login;
/// `memory` and `noop` ignore them). Never falls back: an unknown name is
/// [`Error::InvalidArgument`], a backend whose cargo feature is off
/// [`Error::Unsupported`], and a failed connection the backend's error.
/// With [`ConnectSettings::tls`] the connection is TLS, the servers'
/// certificates are verified against its CA bundle (and name), and its
/// client certificate, if any, is presented. What the CLI's
/// `--coord`/`--coord-url`/`--coord-tls-*` use.
///
/// ```
/// use fleetcoord::coordinator::{connect, ConnectSettings};
///
/// let coord = connect("memory", None, &ConnectSettings::default())?;
/// coord.kv_set("config", "mode", b"on")?;
/// assert!(connect("carrier-pigeon", None, &ConnectSettings::default()).is_err());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub fn connect(
    backend: &str,
    url: Option<&str>,
    settings: &ConnectSettings,
) -> Result<Box<dyn Coordinator>> {
    let url = url.map(str::trim).filter(|u| !u.is_empty());
    match backend.trim().to_ascii_lowercase().as_str() {
        "memory" => Ok(Box::new(MemoryCoordinator::new())),
        "noop" => Ok(Box::new(NoopCoordinator::new())),
        "etcd" => connect_etcd(url, settings),
        "nats" => connect_nats(url, settings),
        "redis" => connect_redis(url, settings.tls.clone()),
        other => Err(Error::invalid(
            "coordinator backend",
            format!("{other:?} is not one of etcd, nats, redis, memory, noop"),
        )),
    }
}

fn connect_etcd(url: Option<&str>, settings: &ConnectSettings) -> Result<Box<dyn Coordinator>> {
    let mut etcd_options = EtcdOptions::default();
    if let Some(tls) = &settings.tls {
        etcd_options = etcd_options.with_tls(tls.clone());
    }
    let options = EtcdCoordinatorOptions::default().with_etcd_options(etcd_options);
    Ok(Box::new(EtcdCoordinator::with_options(
        url.unwrap_or(DEFAULT_ETCD_ENDPOINT),
        options,
    )?))
}

#[cfg(feature = "nats")]
fn connect_nats(url: Option<&str>, settings: &ConnectSettings) -> Result<Box<dyn Coordinator>> {
    let urls = url.unwrap_or(super::nats::DEFAULT_URL);
    let mut options = super::NatsOptions::default();
    if let Some(tls) = &settings.tls {
        options = options.with_tls(tls.clone());
    }
    if let Some(path) = &settings.nats_creds {
        options = options.with_credentials_file(path);
    }
    if let Some(path) = &settings.nats_nkey_file {
        // The io error names no content; the seed is checked (and never
        // quoted) by the backend.
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(
                "COORD_NATS_NKEY_FILE",
                format!("cannot read the NKey seed file {}: {e}", path.display()),
            )
        })?;
        let seed = text.lines().map(str::trim).find(|l| !l.is_empty());
        let Some(seed) = seed else {
            return Err(Error::invalid(
                "COORD_NATS_NKEY_FILE",
                format!("the NKey seed file {} is empty", path.display()),
            ));
        };
        options = options.with_nkey(seed);
    }
    Ok(Box::new(super::NatsCoordinator::with_options(
        urls, options,
    )?))
}

#[cfg(not(feature = "nats"))]
fn connect_nats(_: Option<&str>, _: &ConnectSettings) -> Result<Box<dyn Coordinator>> {
    Err(Error::Unsupported(
        "the nats backend is not built into this binary (cargo feature `nats`)",
    ))
}

/// The redis backend at `url`, speaking TLS with `tls` when given (then
/// `url` must be `rediss://`).
#[cfg(feature = "redis")]
fn connect_redis(url: Option<&str>, tls: Option<crate::Tls>) -> Result<Box<dyn Coordinator>> {
    let url = url.unwrap_or(super::redis::DEFAULT_URL);
    let mut options = super::redis::RedisOptions::default();
    if let Some(tls) = tls {
        options = options.with_tls(tls);
    }
    Ok(Box::new(super::RedisCoordinator::with_options(
        url, options,
    )?))
}

#[cfg(not(feature = "redis"))]
fn connect_redis(_: Option<&str>, _: Option<crate::Tls>) -> Result<Box<dyn Coordinator>> {
    Err(Error::Unsupported(
        "the redis backend is not built into this binary (cargo feature `redis`)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn picks_by_name() {
        let delivers = |pairs: &[(&str, &str)]| {
            try_from_vars(vars(pairs), None)
                .unwrap()
                .capabilities()
                .delivers
        };
        assert!(delivers(&[("COORD", " Memory ")]));
        assert!(!delivers(&[("COORD", "noop")]));
        let memory = try_from_vars(vars(&[("COORD", "memory")]), None).unwrap();
        assert_eq!(memory.describe(), "memory");
    }

    #[test]
    fn tls_variables_go_together_and_name_what_is_missing() {
        assert!(ConnectSettings::from_vars(vars(&[("COORD_TLS_CA", " ")]))
            .unwrap()
            .tls
            .is_none());
        for (pairs, named) in [
            (&[("COORD_TLS_CERT", "c.pem")][..], "invalid COORD_TLS_CA"),
            (
                &[("COORD_TLS_SERVER_NAME", "nats")][..],
                "invalid COORD_TLS_CA",
            ),
            (
                &[
                    ("COORD_TLS_CA", "/nonexistent/ca.pem"),
                    ("COORD_TLS_CERT", "c.pem"),
                ][..],
                "/nonexistent/ca.pem",
            ),
        ] {
            let err = ConnectSettings::from_vars(vars(pairs))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{pairs:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[cfg(feature = "testing")]
    #[test]
    fn tls_variables_build_one_tls() {
        let pki = crate::testing::TestPki::generate().unwrap();
        let (ca, cert, key) = (
            pki.ca_path().display().to_string(),
            pki.client_cert_path().display().to_string(),
            pki.client_key_path().display().to_string(),
        );
        let tls = ConnectSettings::from_vars(vars(&[("COORD_TLS_CA", &ca)]))
            .unwrap()
            .tls
            .unwrap();
        assert!(!tls.has_client_identity());
        let both = [
            ("COORD_TLS_CA", ca.as_str()),
            ("COORD_TLS_CERT", cert.as_str()),
            ("COORD_TLS_KEY", key.as_str()),
            ("COORD_TLS_SERVER_NAME", " localhost "),
        ];
        let tls = ConnectSettings::from_vars(vars(&both))
            .unwrap()
            .tls
            .unwrap();
        assert!(tls.has_client_identity());
        assert_eq!(tls.server_name(), Some("localhost"));
        let err = ConnectSettings::from_vars(vars(&both[..2]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("COORD_TLS_KEY"), "{err}");
        let err = ConnectSettings::from_vars(vars(&[both[0], both[2]]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("COORD_TLS_CERT"), "{err}");
        // A key given as the CA: the error names the file, quotes no key.
        let err = ConnectSettings::from_vars(vars(&[("COORD_TLS_CA", key.as_str())]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&key) && !err.contains("PRIVATE KEY-----\n"),
            "{err}"
        );
    }

    #[test]
    fn nats_logins_are_paths_and_only_one_is_taken() {
        let settings =
            ConnectSettings::from_vars(vars(&[("COORD_NATS_CREDS", "/x/app.creds")])).unwrap();
        assert_eq!(settings.nats_creds, Some(PathBuf::from("/x/app.creds")));
        assert_eq!(settings.nats_nkey_file, None);
        let both = [
            ("COORD_NATS_CREDS", "/x/app.creds"),
            ("COORD_NATS_NKEY_FILE", "/x/seed"),
        ];
        let err = ConnectSettings::from_vars(vars(&both))
            .unwrap_err()
            .to_string();
        assert!(err.contains("set one"), "{err}");
    }

    #[test]
    fn bad_tls_variables_are_an_error_or_a_noop_even_for_memory() {
        let bad = [("COORD", "etcd"), ("COORD_TLS_CERT", "c.pem")];
        assert!(matches!(
            try_from_vars(vars(&bad), None),
            Err(Error::InvalidArgument {
                what: "COORD_TLS_CA",
                ..
            })
        ));
        assert!(!from_vars(vars(&bad), None).capabilities().delivers);
        let memory = [("COORD", "memory"), ("COORD_TLS_CA", "/nonexistent/ca.pem")];
        // Reading the settings fails, so even memory is noop: the operator
        // asked for TLS and must not get a silently different setup.
        let fallback = from_vars(vars(&memory), None);
        assert!(!fallback.capabilities().delivers);
        assert!(
            fallback.describe().contains("/nonexistent/ca.pem"),
            "{}",
            fallback.describe()
        );
        assert!(
            from_vars(vars(&[("COORD", "memory"), ("COORD_TLS_CA", " ")]), None)
                .capabilities()
                .delivers
        );
    }

    /// No logger is installed in this test binary's lib tests: what the
    /// fallback is and why is readable from the coordinator itself.
    #[test]
    fn unknown_and_unavailable_fall_back_to_a_noop_that_says_why() {
        for name in ["bogus", "etcd", "nats", "redis"] {
            let url = "127.0.0.1:1";
            let pairs = [("COORD", name), ("COORD_URL", url)];
            let err = try_from_vars(vars(&pairs), None)
                .map(|c| c.describe())
                .unwrap_err();
            let c = from_vars(vars(&pairs), None);
            assert!(!c.capabilities().delivers, "{name}");
            assert!(c.ping().is_ok(), "{name}");
            let described = c.describe();
            assert!(
                described.starts_with("noop (fallback: ") && described.contains(&err.to_string()),
                "{name}: {described}"
            );
            // The URL once, whether or not the error names it.
            assert_eq!(described.matches(url).count(), 1, "{described}");
        }
    }

    #[test]
    fn unset_coord_means_etcd() {
        match try_from_vars(vars(&[("COORD_URL", "127.0.0.1:1")]), None) {
            Err(Error::Connect {
                backend: "etcd", ..
            }) => {}
            other => panic!("{:?}", other.map(|c| c.describe())),
        }
        let described =
            from_vars(vars(&[("COORD", " "), ("COORD_URL", "127.0.0.1:1")]), None).describe();
        assert!(described.contains("COORD unset (etcd)"), "{described}");
    }
}
