//! Picking a backend from the environment. Coordination is never on the
//! critical path: whatever goes wrong here degrades to noop with a warning.

use super::{Coordinator, EtcdCoordinator, MemoryCoordinator, NoopCoordinator};
use crate::error::{Error, Result};
use crate::etcd::Etcd;

/// The backend named by `COORD` (`memory`, `noop`, `etcd`, `nats`, `redis`;
/// case-insensitive), connected to `COORD_URL` where it needs one.
///
/// Unset or empty `COORD` gives [`MemoryCoordinator`], the embedded default.
/// An unknown value, a backend not built into this binary, or a failed
/// connection logs a warning through `log` and gives [`NoopCoordinator`].
/// Explicit construction always wins: call a backend's constructor to get an
/// error instead of a fallback.
pub fn from_env() -> Box<dyn Coordinator> {
    let coord = std::env::var("COORD").ok();
    let url = std::env::var("COORD_URL").ok();
    from_env_vars(coord.as_deref(), url.as_deref())
}

/// [`from_env`] with the two variables given as arguments (`coord` =
/// `COORD`, `url` = `COORD_URL`), for tests and for configuration that does
/// not come from the environment.
pub fn from_env_vars(coord: Option<&str>, url: Option<&str>) -> Box<dyn Coordinator> {
    pick(coord, url, None)
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
/// let etcd = Etcd::connect(&[server.endpoint()], EtcdOptions::default())?;
/// let coord = from_env_with_etcd(&etcd); // COORD=etcd: shares `etcd`
/// coord.kv_set("config", "rollout", b"50%")?;
/// # Ok(()) }
/// ```
pub fn from_env_with_etcd(etcd: &Etcd) -> Box<dyn Coordinator> {
    let coord = std::env::var("COORD").ok();
    let url = std::env::var("COORD_URL").ok();
    from_env_vars_with_etcd(coord.as_deref(), url.as_deref(), etcd)
}

/// [`from_env_with_etcd`] with the two variables given as arguments
/// (`coord` = `COORD`, `url` = `COORD_URL`; `url` is not used when `coord`
/// names etcd).
pub fn from_env_vars_with_etcd(
    coord: Option<&str>,
    url: Option<&str>,
    etcd: &Etcd,
) -> Box<dyn Coordinator> {
    pick(coord, url, Some(etcd))
}

/// The one selection both entry points share; `etcd`, when given, replaces
/// connecting to `url` for the etcd backend.
fn pick(coord: Option<&str>, url: Option<&str>, etcd: Option<&Etcd>) -> Box<dyn Coordinator> {
    let name = coord.map(str::trim).unwrap_or("").to_ascii_lowercase();
    let connected = match (name.as_str(), etcd) {
        ("", _) => return Box::new(MemoryCoordinator::new()),
        ("etcd", Some(etcd)) => {
            EtcdCoordinator::new(etcd).map(|c| Box::new(c) as Box<dyn Coordinator>)
        }
        _ => connect(&name, url),
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
/// backend's error. What the CLI's `--coord`/`--coord-url` use.
///
/// ```
/// let coord = fleetcoord::coordinator::connect("memory", None)?;
/// coord.kv_set("config", "mode", b"on")?;
/// assert!(fleetcoord::coordinator::connect("carrier-pigeon", None).is_err());
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub fn connect(backend: &str, url: Option<&str>) -> Result<Box<dyn Coordinator>> {
    let url = url.map(str::trim).filter(|u| !u.is_empty());
    match backend.trim().to_ascii_lowercase().as_str() {
        "memory" => Ok(Box::new(MemoryCoordinator::new())),
        "noop" => Ok(Box::new(NoopCoordinator::new())),
        "etcd" => Ok(Box::new(EtcdCoordinator::connect(
            url.unwrap_or("127.0.0.1:2379"),
        )?)),
        "nats" => connect_nats(url),
        "redis" => connect_redis(url, None),
        other => Err(Error::invalid(
            "coordinator backend",
            format!("{other:?} is not one of memory, noop, etcd, nats, redis"),
        )),
    }
}

#[cfg(feature = "nats")]
fn connect_nats(url: Option<&str>) -> Result<Box<dyn Coordinator>> {
    let url = url.unwrap_or(super::nats::DEFAULT_URL);
    Ok(Box::new(super::NatsCoordinator::connect(url)?))
}

#[cfg(not(feature = "nats"))]
fn connect_nats(_: Option<&str>) -> Result<Box<dyn Coordinator>> {
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

    #[test]
    fn unknown_and_unavailable_fall_back_to_noop() {
        for name in ["bogus", "etcd", "nats", "redis"] {
            let c = from_env_vars(Some(name), Some("http://127.0.0.1:1"));
            assert!(!c.capabilities().delivers, "{name}");
            assert!(c.ping().is_ok(), "{name}");
        }
    }
}
