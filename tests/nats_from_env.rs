//! Wiring and options of the NATS backend: `COORD=nats` with `COORD_URL`
//! reaches a real server, several URLs fail over, credentials are used,
//! and bad options are rejected before connecting.

use fleetcoord::coordinator::{
    connect, try_from_vars, ConnectSettings, Coordinator, NatsCoordinator, NatsOptions,
};
use fleetcoord::testing::{NatsBuilder, NatsServer};
use fleetcoord::Error;
use std::time::Duration;

fn start() -> NatsServer {
    NatsServer::start().expect("start nats-server (`make deps-nats` installs it)")
}

#[test]
fn coord_nats_and_coord_url_reach_the_server() {
    let server = start();
    let url = server.url();
    let direct = NatsCoordinator::connect(&url).unwrap();

    let lookup = |name: &str| match name {
        "COORD" => Some(" NATS ".to_string()),
        "COORD_URL" => Some(url.clone()),
        _ => None,
    };
    let from_env = try_from_vars(lookup, None).unwrap();
    assert!(from_env.capabilities().delivers);
    from_env.kv_set("config", "rollout", b"50%").unwrap();
    assert_eq!(direct.kv_get("config", "rollout").unwrap(), b"50%");

    let explicit = connect("nats", Some(&url), &ConnectSettings::default()).unwrap();
    assert_eq!(explicit.kv_get("config", "rollout").unwrap(), b"50%");

    // A dead first URL is skipped.
    let listed = connect(
        "nats",
        Some(&format!("nats://127.0.0.1:1, {url}")),
        &ConnectSettings::default(),
    )
    .unwrap();
    listed.ping().unwrap();
}

#[test]
fn credentials_are_used() {
    let server = NatsBuilder::new()
        .user_password("app", "s3cret")
        .start()
        .expect("start nats-server (`make deps-nats` installs it)");
    let url = server.url();
    let fast = NatsOptions::default().with_connect_timeout(Duration::from_secs(3));
    match NatsCoordinator::with_options(&url, fast.clone()) {
        Err(Error::Connect { endpoints, .. }) => assert_eq!(endpoints, server.url()),
        other => panic!("connecting without credentials: {other:?}"),
    }
    assert!(
        NatsCoordinator::with_options(&url, fast.clone().with_user_password("app", "wrong"))
            .is_err()
    );
    let c = NatsCoordinator::with_options(&url, fast.with_user_password("app", "s3cret")).unwrap();
    c.kv_set("b", "k", b"v").unwrap();
    // The password never shows in debug output.
    let shown = format!(
        "{:?}",
        NatsOptions::default().with_user_password("app", "s3cret")
    );
    assert!(!shown.contains("s3cret"), "{shown}");

    let server = NatsBuilder::new().token("t0ken").start().unwrap();
    let url = server.url();
    let options = NatsOptions::default();
    assert!(NatsCoordinator::with_options(&url, options.clone().with_token("nope")).is_err());
    NatsCoordinator::with_options(&url, options.with_token("t0ken"))
        .unwrap()
        .ping()
        .unwrap();
}

#[test]
fn bad_options_are_rejected_before_connecting() {
    let (url, base) = ("nats://127.0.0.1:1", NatsOptions::default());
    let cases = [
        (" , ", base.clone(), "urls"),
        ("nats://host:notaport", base.clone(), "urls"),
        (url, base.clone().with_kv_replicas(0), "kv_replicas"),
        (url, base.clone().with_stream_replicas(6), "stream_replicas"),
        (url, base.clone().with_stream_max_len(0), "stream_max_len"),
        (
            url,
            base.clone().with_stream_max_len(u64::MAX),
            "stream_max_len",
        ),
        (
            url,
            base.clone().with_stream_max_age(Duration::from_millis(10)),
            "stream_max_age",
        ),
        (
            url,
            base.clone().with_request_timeout(Duration::ZERO),
            "request_timeout",
        ),
        (url, base.clone().with_feed_capacity(1), "feed_capacity"),
    ];
    for (urls, options, field) in cases {
        match NatsCoordinator::with_options(urls, options) {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}
