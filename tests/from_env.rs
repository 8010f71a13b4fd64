//! `from_vars`/`try_from_vars` with an `Etcd` handle: `COORD=etcd` (or
//! unset) reuses the process's handle instead of connecting to
//! `COORD_URL`; every other `COORD` behaves as without one. `COORD_TLS_*`
//! reach a TLS etcd with client certificates. `from_env` reads the
//! process environment and falls back to a noop that says why.

mod common;

use common::{connect, etcdctl, start_etcd};
use fleetcoord::coordinator::{from_env, from_vars, try_from_env, try_from_vars};
use fleetcoord::Error;

/// Nothing listens on port 1: connecting there fails.
const DEAD_URL: &str = "127.0.0.1:1";

/// A lookup of `COORD` = `coord` and `COORD_URL` = `url`, nothing else.
fn vars(coord: Option<&str>, url: Option<&str>) -> impl Fn(&str) -> Option<String> {
    let (coord, url) = (coord.map(str::to_string), url.map(str::to_string));
    move |name| match name {
        "COORD" => coord.clone(),
        "COORD_URL" => url.clone(),
        _ => None,
    }
}

#[test]
fn etcd_uses_the_given_handle_not_coord_url() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);

    // Connecting to COORD_URL would fail and fall back to noop...
    assert!(
        !from_vars(vars(Some("etcd"), Some(DEAD_URL)), None)
            .capabilities()
            .delivers
    );
    // ...the given handle is used instead, whatever COORD_URL says, also
    // with COORD unset (etcd is the default).
    for (coord, url) in [
        (Some(" ETCD "), Some(DEAD_URL)),
        (Some("etcd"), None),
        (None, Some(DEAD_URL)),
    ] {
        let coord = try_from_vars(vars(coord, url), Some(&etcd)).unwrap();
        assert!(coord.capabilities().delivers, "{url:?}");
        assert!(
            coord.describe().starts_with("etcd at "),
            "{}",
            coord.describe()
        );
        coord.kv_set("config", "rollout", b"50%").unwrap();
        assert_eq!(
            etcdctl(
                &endpoint,
                &["get", "/coord/kv/config/rollout", "--print-value-only"]
            )
            .trim(),
            "50%"
        );
        // Closing the coordinator leaves the shared handle open.
        coord.close().unwrap();
        assert!(etcd.lease_ttl(1).is_ok());
    }

    // It is that very connection: once the user closed the handle, the
    // coordinator is closed too.
    let coord = from_vars(vars(Some("etcd"), Some(DEAD_URL)), Some(&etcd));
    coord.ping().unwrap();
    etcd.close().unwrap();
    assert!(matches!(coord.ping(), Err(Error::Closed)));
}

#[test]
fn other_backends_behave_as_without_a_handle() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    for (coord, delivers) in [
        (Some("memory"), true),
        (Some("noop"), false),
        (Some("bogus"), false),
        (Some("nats"), false),
        (Some("redis"), false),
    ] {
        let shared = from_vars(vars(coord, Some(DEAD_URL)), Some(&etcd));
        let own = from_vars(vars(coord, Some(DEAD_URL)), None);
        assert_eq!(shared.capabilities(), own.capabilities(), "{coord:?}");
        assert_eq!(shared.describe(), own.describe(), "{coord:?}");
        assert_eq!(shared.capabilities().delivers, delivers, "{coord:?}");
        assert!(shared.ping().is_ok(), "{coord:?}");
    }
}

/// The only test here that touches the process environment, so no other
/// test can observe the change.
#[test]
fn reads_coord_and_coord_url_from_the_environment() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    std::env::set_var("COORD", "etcd");
    std::env::set_var("COORD_URL", DEAD_URL);
    let refused = try_from_env().map(|c| c.describe());
    let fallback = from_env();
    // COORD unset: etcd at COORD_URL.
    std::env::remove_var("COORD");
    std::env::set_var("COORD_URL", &endpoint);
    let own = from_env();
    std::env::remove_var("COORD_URL");
    match refused {
        Err(Error::Connect {
            backend: "etcd", ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(
        fallback
            .describe()
            .starts_with("noop (fallback: cannot connect to etcd"),
        "{}",
        fallback.describe()
    );
    assert!(own.capabilities().delivers, "{}", own.describe());
    own.publish("deploys", b"v42").unwrap();
    assert_eq!(
        etcdctl(
            &endpoint,
            &["get", "/coord/topic/deploys", "--print-value-only"]
        )
        .trim(),
        "v42"
    );
}

#[test]
fn coord_tls_variables_reach_a_tls_etcd() {
    let server = fleetcoord::testing::EtcdBuilder::new()
        .client_cert_auth()
        .start()
        .expect("start a TLS etcd");
    let pki = server.pki().expect("a TLS server has test certificates");
    let url = server.endpoints().join(",");
    let vars = [
        ("COORD", "etcd".to_string()),
        ("COORD_URL", url.clone()),
        ("COORD_TLS_CA", pki.ca_path().display().to_string()),
        (
            "COORD_TLS_CERT",
            pki.client_cert_path().display().to_string(),
        ),
        ("COORD_TLS_KEY", pki.client_key_path().display().to_string()),
    ];
    let lookup = |n: usize| {
        let vars = vars[..n].to_vec();
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        }
    };
    let coord = from_vars(lookup(5), None);
    assert!(coord.capabilities().delivers, "not connected (noop)");
    coord.kv_set("config", "rollout", b"50%").unwrap();
    assert_eq!(coord.kv_get("config", "rollout").unwrap(), b"50%");
    // Without the client certificate etcd refuses: an error, or a noop.
    assert!(matches!(
        try_from_vars(lookup(3), None),
        Err(Error::Connect {
            backend: "etcd",
            ..
        })
    ));
    assert!(!from_vars(lookup(3), None).capabilities().delivers);
}
