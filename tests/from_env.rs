//! `from_env_with_etcd`: `COORD=etcd` reuses the process's `Etcd` handle
//! instead of connecting to `COORD_URL`; every other `COORD` behaves as in
//! `from_env`. `COORD_TLS_*` reach a TLS etcd with client certificates.

mod common;

use common::{connect, etcdctl, start_etcd};
use fleetcoord::coordinator::{
    from_env, from_env_vars, from_env_vars_with_etcd, from_env_with_etcd,
};
use fleetcoord::Error;

/// Nothing listens on port 1: connecting there fails.
const DEAD_URL: &str = "127.0.0.1:1";

#[test]
fn etcd_uses_the_given_handle_not_coord_url() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);

    // Connecting to COORD_URL would fail and fall back to noop...
    assert!(
        !from_env_vars(Some("etcd"), Some(DEAD_URL))
            .capabilities()
            .delivers
    );
    // ...the given handle is used instead, whatever COORD_URL says.
    for url in [Some(DEAD_URL), None] {
        let coord = from_env_vars_with_etcd(Some(" ETCD "), url, &etcd);
        assert!(coord.capabilities().delivers, "{url:?}");
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
    let coord = from_env_vars_with_etcd(Some("etcd"), Some(DEAD_URL), &etcd);
    coord.ping().unwrap();
    etcd.close().unwrap();
    assert!(matches!(coord.ping(), Err(Error::Closed)));
}

#[test]
fn other_backends_behave_as_from_env() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    for (coord, delivers) in [
        (None, true),
        (Some(""), true),
        (Some("memory"), true),
        (Some("noop"), false),
        (Some("bogus"), false),
        (Some("nats"), false),
        (Some("redis"), false),
    ] {
        let shared = from_env_vars_with_etcd(coord, Some(DEAD_URL), &etcd);
        let own = from_env_vars(coord, Some(DEAD_URL));
        assert_eq!(shared.capabilities(), own.capabilities(), "{coord:?}");
        assert_eq!(shared.capabilities().delivers, delivers, "{coord:?}");
        assert!(shared.ping().is_ok(), "{coord:?}");
    }
}

/// The only test here that touches the process environment, so no other
/// test can observe the change.
#[test]
fn reads_coord_and_ignores_coord_url_from_the_environment() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    std::env::set_var("COORD", "etcd");
    std::env::set_var("COORD_URL", DEAD_URL);
    let coord = from_env_with_etcd(&etcd);
    // Without a handle, COORD_URL is where it connects.
    std::env::set_var("COORD_URL", &endpoint);
    let own = from_env();
    std::env::remove_var("COORD");
    std::env::remove_var("COORD_URL");
    own.kv_set("config", "mode", b"own").unwrap();
    assert_eq!(coord.kv_get("config", "mode").unwrap(), b"own");
    assert!(coord.capabilities().delivers);
    coord.publish("deploys", b"v42").unwrap();
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
    let coord = fleetcoord::coordinator::from_lookup(lookup(5));
    assert!(coord.capabilities().delivers, "not connected (noop)");
    coord.kv_set("config", "rollout", b"50%").unwrap();
    assert_eq!(coord.kv_get("config", "rollout").unwrap(), b"50%");
    // Without the client certificate etcd refuses: noop, not an error.
    assert!(
        !fleetcoord::coordinator::from_lookup(lookup(3))
            .capabilities()
            .delivers
    );
}
