//! Picking a backend from the environment. Coordination is never on the
//! critical path: whatever goes wrong here degrades to noop with a warning.
//!
//! Besides `COORD` and `COORD_URL`, the `COORD_TLS_*` and `COORD_NATS_*`
//! variables of [`ConnectSettings`] apply.

use super::{Coordinator, EtcdCoordinator, MemoryCoordinator, NoopCoordinator};
use crate::error::{Error, Result};
use crate::etcd::{Etcd, EtcdOptions};
use crate::tls::Tls;
use std::path::PathBuf;

/// What a connection needs besides the backend's name and URL, applied by
/// [`connect_with`] to whichever backend it connects: TLS, and for NATS a
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

/// The backend named by `COORD` (`memory`, `noop`, `etcd`, `nats`, `redis`;
/// case-insensitive), connected to `COORD_URL` where it needs one, with
/// the `COORD_TLS_*` and `COORD_NATS_*` variables (see [`ConnectSettings`]).
///
/// Unset or empty `COORD` gives [`MemoryCoordinator`], the embedded default.
/// An unknown value, a backend not built into this binary, unusable
/// `COORD_TLS_*` settings, or a failed connection logs a warning through
/// `log` and gives [`NoopCoordinator`].
/// Explicit construction always wins: call a backend's constructor to get an
/// error instead of a fallback.
pub fn from_env() -> Box<dyn Coordinator> {
    from_lookup(|name| std::env::var(name).ok())
}

/// [`from_env`] with every variable (`COORD`, `COORD_URL`, `COORD_TLS_*`)
/// looked up through `var` instead of the environment, for tests and for
/// configuration that does not come from the environment.
pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Box<dyn Coordinator> {
    let coord = var("COORD");
    let url = var("COORD_URL");
    let name = coord.as_deref().map(str::trim).unwrap_or("");
    if name.is_empty() {
        return Box::new(MemoryCoordinator::new());
    }
    match ConnectSettings::from_vars(&var) {
        Ok(settings) => pick(coord.as_deref(), url.as_deref(), None, &settings),
        Err(e) => {
            let name = name.to_ascii_lowercase();
            log::warn!("COORD={name}: {e}; coordination is disabled (noop)");
            Box::new(NoopCoordinator::new())
        }
    }
}

/// [`from_env`] with the two variables given as arguments (`coord` =
/// `COORD`, `url` = `COORD_URL`), for tests and for configuration that does
/// not come from the environment.
pub fn from_env_vars(coord: Option<&str>, url: Option<&str>) -> Box<dyn Coordinator> {
    pick(coord, url, None, &ConnectSettings::default())
}

/// [`from_env`] for a process that already has an [`Etcd`] handle: with
/// `COORD=etcd` the coordinator is an [`EtcdCoordinator`] on `etcd` (default
/// options), so the process keeps one etcd connection and one driver
/// thread. `COORD_URL` is then not used at all — the handle's own endpoints
/// apply — and no connection attempt can fail. Every other `COORD` value
/// behaves exactly as in [`from_env`], `COORD_URL` included.
///
/// The coordinator holds a clone of `etcd`, so the connection stays up
/// while either is in use; closing the coordinator does not close `etcd`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::coordinator::from_env_with_etcd;
/// use fleetcoord::{Etcd, EtcdOptions};
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let coord = from_env_with_etcd(&etcd); // COORD=etcd: shares `etcd`
/// coord.kv_set("config", "rollout", b"50%")?;
/// # Ok(()) }
/// ```
pub fn from_env_with_etcd(etcd: &Etcd) -> Box<dyn Coordinator> {
    let var = |name: &str| std::env::var(name).ok();
    let coord = var("COORD");
    let url = var("COORD_URL");
    let name = coord.as_deref().map(str::trim).unwrap_or("");
    let etcd_named = name.eq_ignore_ascii_case("etcd");
    // The shared handle has its own TLS; COORD_TLS_* is for connecting.
    let settings = if name.is_empty() || etcd_named {
        Ok(ConnectSettings::default())
    } else {
        ConnectSettings::from_vars(var)
    };
    match settings {
        Ok(settings) => pick(coord.as_deref(), url.as_deref(), Some(etcd), &settings),
        Err(e) => {
            let name = name.to_ascii_lowercase();
            log::warn!("COORD={name}: {e}; coordination is disabled (noop)");
            Box::new(NoopCoordinator::new())
        }
    }
}

/// [`from_env_with_etcd`] with the two variables given as arguments
/// (`coord` = `COORD`, `url` = `COORD_URL`; `url` is not used when `coord`
/// names etcd). No TLS: [`from_env_with_etcd`] reads `COORD_TLS_*`.
pub fn from_env_vars_with_etcd(
    coord: Option<&str>,
    url: Option<&str>,
    etcd: &Etcd,
) -> Box<dyn Coordinator> {
    pick(coord, url, Some(etcd), &ConnectSettings::default())
}

/// The one selection every entry point shares; `etcd`, when given, replaces
/// connecting to `url` for the etcd backend.
fn pick(
    coord: Option<&str>,
    url: Option<&str>,
    etcd: Option<&Etcd>,
    settings: &ConnectSettings,
) -> Box<dyn Coordinator> {
    let name = coord.map(str::trim).unwrap_or("").to_ascii_lowercase();
    let connected = match (name.as_str(), etcd) {
        ("", _) => return Box::new(MemoryCoordinator::new()),
        ("etcd", Some(etcd)) => {
            EtcdCoordinator::on_etcd(etcd).map(|c| Box::new(c) as Box<dyn Coordinator>)
        }
        _ => connect_with(&name, url, settings),
    };
    match connected {
        Ok(coordinator) => coordinator,
        Err(e) => {
            let url = url.map(str::trim).filter(|u| !u.is_empty());
            let at = url.map(|u| format!(" at {u}")).unwrap_or_default();
            log::warn!("COORD={name}{at}: {e}; coordination is disabled (noop)");
            Box::new(NoopCoordinator::new())
        }
    }
}

/// Connects the backend named `backend` (`memory`, `noop`, `etcd`, `nats`,
/// `redis`; case-insensitive) to `url`, the backend's comma-separated
/// server list (`None` or blank: the backend's local default, e.g.
/// `127.0.0.1:2379` for etcd). Unlike [`from_env`] it never falls back:
/// an unknown name is [`Error::InvalidArgument`], a backend whose cargo
/// feature is off [`Error::Unsupported`], and a failed connection the
/// backend's error. No TLS: see [`connect_with`].
///
/// ```
/// let coord = fleetcoord::coordinator::connect("memory", None)?;
/// coord.kv_set("config", "mode", b"on")?;
/// assert!(fleetcoord::coordinator::connect("carrier-pigeon", None).is_err());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub fn connect(backend: &str, url: Option<&str>) -> Result<Box<dyn Coordinator>> {
    connect_with(backend, url, &ConnectSettings::default())
}

/// [`connect`] with `settings` applied to the backend: with
/// [`ConnectSettings::tls`] the connection is TLS, the servers'
/// certificates are verified against its CA bundle (and name), and its
/// client certificate, if any, is presented. The backends `memory` and
/// `noop` ignore the settings. What the CLI's
/// `--coord`/`--coord-url`/`--coord-tls-*` use.
pub fn connect_with(
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
            format!("{other:?} is not one of memory, noop, etcd, nats, redis"),
        )),
    }
}

fn connect_etcd(url: Option<&str>, settings: &ConnectSettings) -> Result<Box<dyn Coordinator>> {
    let Some(tls) = &settings.tls else {
        return Ok(Box::new(EtcdCoordinator::connect(
            url.unwrap_or("127.0.0.1:2379"),
        )?));
    };
    let endpoints: Vec<&str> = url
        .unwrap_or("127.0.0.1:2379")
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let etcd = Etcd::with_options(&endpoints, EtcdOptions::default().with_tls(tls.clone()))?;
    Ok(Box::new(EtcdCoordinator::on_etcd(&etcd)?))
}

#[cfg(feature = "nats")]
fn connect_nats(url: Option<&str>, settings: &ConnectSettings) -> Result<Box<dyn Coordinator>> {
    let mut options =
        super::NatsOptions::default().with_urls(url.unwrap_or(super::nats::DEFAULT_URL));
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
    Ok(Box::new(super::NatsCoordinator::with_options(options)?))
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

    #[test]
    fn picks_by_name() {
        assert!(from_env_vars(None, None).capabilities().delivers);
        assert!(
            from_env_vars(Some(" Memory "), None)
                .capabilities()
                .delivers
        );
        assert!(!from_env_vars(Some("noop"), None).capabilities().delivers);
    }

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
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
    fn bad_tls_variables_fall_back_to_noop_even_for_memory() {
        let bad = [("COORD", "etcd"), ("COORD_TLS_CERT", "c.pem")];
        assert!(!from_lookup(vars(&bad)).capabilities().delivers);
        let memory = [("COORD", "memory"), ("COORD_TLS_CA", "/nonexistent/ca.pem")];
        // Reading the settings fails, so even memory is noop: the operator
        // asked for TLS and must not get a silently different setup.
        assert!(!from_lookup(vars(&memory)).capabilities().delivers);
        assert!(
            from_lookup(vars(&[("COORD_TLS_CA", "/x")]))
                .capabilities()
                .delivers
        );
    }

    #[test]
    fn unknown_and_unavailable_fall_back_to_noop() {
        for name in ["bogus", "etcd", "nats", "redis"] {
            let c = from_env_vars(Some(name), Some("http://127.0.0.1:1"));
            assert!(!c.capabilities().delivers, "{name}");
            assert!(c.ping().is_ok(), "{name}");
        }
    }
}
