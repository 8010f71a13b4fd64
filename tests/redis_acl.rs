//! The Redis backend as an ACL user: the user of the module docs' `ACL
//! SETUSER` line (keys and channels `coord:*`, only the commands listed)
//! passes the conformance suite and is refused everything else, and a
//! wrong password is `WRONGPASS`, not retryable, never quoted. Plain TCP,
//! so `make test-matrix` runs it on every Redis version (the TLS side is
//! tests/redis_tls.rs).

mod common;

use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{Coordinator, RedisCoordinator};
use fleetcoord::error::ErrorKind;
use fleetcoord::testing::RedisBuilder;
use fleetcoord::Error;
use std::sync::Mutex;
use std::time::Duration;

const USER: &str = "fleet";
const PASSWORD: &str = "fleet-pw-7f3a";

fn as_user() -> RedisOptions {
    RedisOptions::default()
        .with_username(USER)
        .with_password(PASSWORD)
}

#[test]
fn the_documented_user_is_limited_to_coord_keys_and_channels() {
    let rules = common::redis_acl_rules();
    for needed in ["~coord:*", "&coord:*", "-@all"] {
        assert!(rules.contains(&needed), "{needed} in {rules:?}");
    }
    assert!(
        !rules
            .iter()
            .any(|r| r.starts_with("+@") || *r == "~*" || *r == "&*"),
        "{rules:?}"
    );
}

#[test]
fn the_documented_acl_user_conforms_and_is_held_to_its_rules() {
    let server = RedisBuilder::new()
        .persistent()
        .acl_user(USER, PASSWORD, &common::redis_acl_rules())
        .start()
        .expect("start redis-server (run `make deps-redis`)");
    let url = server.url();
    let coord = RedisCoordinator::with_options(&url, as_user()).expect("connect as the ACL user");
    coord.kv_set("b", "k", b"v").expect("a write under coord:");
    drop(coord);
    // The rules bite: outside `coord:` and outside the list, no permission.
    let denied = server.command(&["ACL", "DRYRUN", USER, "SET", "other:key", "x"]);
    assert!(
        matches!(&denied, Ok(text) if text.contains("no permissions to access the 'other:key' key")),
        "{denied:?}"
    );
    let denied = server.command(&["ACL", "DRYRUN", USER, "FLUSHALL"]);
    assert!(
        matches!(&denied, Ok(text) if text.contains("no permissions to run the 'flushall' command")),
        "{denied:?}"
    );
    let server = Mutex::new(server);
    let report = fleetcoord::conformance::run_with_restart(
        || {
            let options = as_user().with_stream_max_len(64);
            Box::new(RedisCoordinator::with_options(&url, options).expect("connect"))
                as Box<dyn Coordinator>
        },
        || server.lock().unwrap_or_else(|p| p.into_inner()).restart(),
    );
    report.assert_nothing_skipped();
}

#[test]
fn a_wrong_password_is_wrongpass_in_one_line() {
    let server = RedisBuilder::new()
        .acl_user(USER, PASSWORD, &common::redis_acl_rules())
        .start()
        .expect("start redis-server (run `make deps-redis`)");
    let options = RedisOptions::default()
        .with_username(USER)
        .with_password("not-the-password")
        .with_connect_timeout(Duration::from_secs(3));
    let e = RedisCoordinator::with_options(&server.url(), options).expect_err("wrong password");
    let text = e.to_string();
    assert!(text.contains("WRONGPASS"), "{text}");
    assert!(
        !text.contains('\n') && !text.contains("not-the-password"),
        "{text}"
    );
    assert!(
        matches!(
            e,
            Error::Connect {
                kind: ErrorKind::PermissionDenied,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_retryable(), "{text}");
}
