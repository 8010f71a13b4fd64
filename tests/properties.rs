//! Property tests of the public surface: generated options, names, keys,
//! patterns, payload sizes, durations from zero to `Duration::MAX` and
//! endpoint strings. Every input must give `Ok` or a typed error — never a
//! panic, and never a wait past the timeout the API documents for it.
//!
//! Each test that needs etcd starts one `EtcdServer` and runs all its cases
//! against it. Endpoint strings only ever name loopback hosts, so even an
//! endpoint accepted by mistake is dialled on this machine (arbitrary text
//! is the parser's own property test, which dials nothing).
//!
//! Case counts are fixed below so the whole file stays well under a minute
//! on a 2-core machine; each check prints its count. The seed is fixed too,
//! so CI runs the same inputs every time; set `PROPTEST_RNG_SEED` to
//! explore others.

mod common;

use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, EtcdCoordinatorOptions, MemoryCoordinator, StreamPosition,
};
use fleetcoord::testing::EtcdServer;
use fleetcoord::{
    list_hosts, Election, ElectionOptions, ElectionPool, Error, Etcd, EtcdOptions, HostLiveness,
    HostWatcher, LivenessOptions, TryCampaign, WatcherOptions,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The largest payload the library accepts.
const MAX_PAYLOAD: usize = fleetcoord::coordinator::MAX_PAYLOAD;

/// The seed of every run unless `PROPTEST_RNG_SEED` says otherwise.
const SEED: u64 = 0x0f1e_e7c0_02d5_eed5;

/// Beyond a call's own documented timeout, how long it may take on a
/// loaded machine (thread start-up, a close's grace period).
const SLACK: Duration = Duration::from_secs(15);

/// Runs `cases` generated inputs through `body`, which says whether the
/// input was accepted; a failure shrinks and reports the smallest input.
/// Counts the accepted ones, so that a strategy producing only refused
/// input (which never reaches etcd) fails instead of passing vacuously.
fn check<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    body: impl Fn(S::Value) -> Result<bool, TestCaseError>,
) {
    let defaults = Config::default();
    // A fixed seed keeps CI deterministic; PROPTEST_RNG_SEED=<n> explores
    // other inputs (and reproduces a reported failure).
    let rng_seed = match std::env::var_os("PROPTEST_RNG_SEED") {
        Some(_) => defaults.rng_seed,
        None => RngSeed::Fixed(SEED),
    };
    let config = Config {
        cases,
        // Shrinking re-runs against etcd; a few dozen steps find the point.
        max_shrink_iters: 64,
        failure_persistence: None,
        rng_seed,
        ..defaults
    };
    let started = Instant::now();
    let accepted = std::cell::Cell::new(0u32);
    TestRunner::new(config)
        .run(&strategy, |input| {
            let ok = body(input)?;
            accepted.set(accepted.get() + u32::from(ok));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let accepted = accepted.get();
    println!(
        "{name}: {cases} cases, {accepted} accepted, in {:?}",
        started.elapsed()
    );
    assert!(
        accepted >= cases / 10,
        "{name}: only {accepted} of {cases} inputs were accepted; the strategy misses the accepted path"
    );
}

/// Durations over the whole range, with the edges of every documented
/// bound, `Duration::MAX` and values that overflow `Instant` arithmetic.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        prop::sample::select(vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(999),
            Duration::from_millis(1),
            Duration::from_millis(999),
            Duration::from_secs(1),
            Duration::from_millis(1500),
            Duration::from_secs(3600),
            Duration::from_secs(3601),
            Duration::from_secs(86_400),
            Duration::from_secs(86_401),
            Duration::from_secs(u64::MAX / 2),
            Duration::MAX,
        ]),
        (0u64..=10_000).prop_map(Duration::from_millis),
        (0u64..=200_000).prop_map(Duration::from_secs),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// A duration option ranging `min..=max`: mostly inside the range (spread
/// over it, its edges included), otherwise anything [`duration`] makes.
fn option_duration(min: Duration, max: Duration) -> impl Strategy<Value = Duration> {
    let span = u64::try_from((max - min).as_millis()).unwrap_or(u64::MAX);
    prop_oneof![
        2 => (0..=span.min(10_000)).prop_map(move |ms| min + Duration::from_millis(ms)),
        1 => (0..=span).prop_map(move |ms| min + Duration::from_millis(ms)),
        1 => prop::sample::select(vec![min, max]),
        1 => duration(),
    ]
}

/// Lease TTLs: mostly short valid ones (so leases do not pile up), and
/// every kind of invalid one.
fn ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => (1u64..=10).prop_map(Duration::from_secs),
        2 => duration(),
    ]
}

/// Name-like text: plain segments, paths with `/`, control characters,
/// arbitrary Unicode, the empty string and lengths around the limits.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => "[a-z0-9._-]{1,16}",
        1 => "[a-z]{0,4}(/[a-z]{0,4}){1,3}",
        1 => "[a-z]{0,4}[\\x00-\\x1f\\x7f][a-z]{0,4}",
        1 => any::<String>().prop_map(|s| s.chars().take(24).collect::<String>()),
        1 => Just(String::new()),
        1 => (250usize..=260).prop_map(|n| "n".repeat(n)),
        1 => (1020usize..=1030).prop_map(|n| "k".repeat(n)),
    ]
}

/// Key prefixes (`/a/b/` is valid), and near misses.
fn prefix() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "/[a-z]{1,6}(/[a-z]{1,6}){0,2}/",
        1 => "[a-z/]{0,8}",
        1 => name(),
        1 => (1020usize..=1030).prop_map(|n| format!("/{}/", "p".repeat(n))),
    ]
}

/// Payload sizes around the limit, and small ones.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..64),
        1 => prop::sample::select(vec![MAX_PAYLOAD, MAX_PAYLOAD + 1, 1536 * 1024, 2 << 20])
            .prop_map(|n| vec![b'x'; n]),
    ]
}

/// Channel capacities, with the edges of 2..=1,048,576.
fn capacity() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 2usize..=64,
        1 => prop::sample::select(vec![0, 1, 1 << 20, (1 << 20) + 1, usize::MAX]),
        1 => any::<usize>(),
    ]
}

fn in_range(d: Duration, min: Duration, max: Duration) -> bool {
    (min..=max).contains(&d)
}

const MS: Duration = Duration::from_millis(1);
const DAY: Duration = Duration::from_secs(86_400);

/// Whether `d` is a valid lease TTL: whole seconds, 1 s to a day.
fn valid_ttl(d: Duration) -> bool {
    in_range(d, Duration::from_secs(1), DAY) && d.subsec_nanos() == 0
}

/// `result` is `Ok`, or an error of a kind the call may give: an
/// `InvalidArgument` naming one of `fields`, or one of the `also` kinds.
fn typed<T: std::fmt::Debug>(
    call: &str,
    result: &fleetcoord::Result<T>,
    fields: &[&str],
    also: fn(&Error) -> bool,
) -> Result<(), TestCaseError> {
    match result {
        Ok(_) => Ok(()),
        Err(Error::InvalidArgument { what, why }) => {
            prop_assert!(
                fields.contains(what),
                "{call}: InvalidArgument names {what:?} ({why}), expected one of {fields:?}"
            );
            prop_assert!(!why.is_empty());
            Ok(())
        }
        Err(e) => {
            prop_assert!(also(e), "{call}: unexpected error {e:?}");
            Ok(())
        }
    }
}

fn no_other(_: &Error) -> bool {
    false
}

fn field_of<T>(result: &fleetcoord::Result<T>) -> Option<&'static str> {
    match result {
        Err(Error::InvalidArgument { what, .. }) => Some(what),
        _ => None,
    }
}

#[test]
fn etcd_options_are_ok_or_refused_by_field() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    let strategy = (
        option_duration(MS, DAY),
        option_duration(MS, DAY),
        option_duration(Duration::from_secs(1), Duration::from_secs(3600)),
    );
    check(
        "EtcdOptions",
        128,
        strategy,
        |(connect_timeout, request_timeout, keepalive_interval)| {
            let options = EtcdOptions::default()
                .with_connect_timeout(connect_timeout)
                .with_request_timeout(request_timeout)
                .with_keepalive_interval(keepalive_interval);
            let valid = [
                ("connect_timeout", in_range(connect_timeout, MS, DAY)),
                ("request_timeout", in_range(request_timeout, MS, DAY)),
                (
                    "keepalive_interval",
                    in_range(
                        keepalive_interval,
                        Duration::from_secs(1),
                        Duration::from_secs(3600),
                    ),
                ),
            ];
            let started = Instant::now();
            let result = Etcd::with_options(&[endpoint.as_str()], options);
            let took = started.elapsed();
            typed(
                "connect",
                &result,
                &["connect_timeout", "request_timeout", "keepalive_interval"],
                |e| {
                    // A 1 ms connect timeout may fail to connect; that is typed.
                    matches!(e, Error::Connect { .. })
                },
            )?;
            let first_bad = valid.iter().find(|(_, ok)| !ok).map(|(f, _)| *f);
            prop_assert_eq!(field_of(&result), first_bad, "{:?}", result);
            prop_assert!(
                took < connect_timeout.min(SLACK) + SLACK,
                "connect took {took:?} with a {connect_timeout:?} timeout"
            );
            if let Ok(etcd) = result {
                // One request: an answer or a timeout within the request
                // timeout, whatever it is.
                let started = Instant::now();
                let listed = list_hosts(&etcd, "/props/hosts/");
                typed("list_hosts", &listed, &[], |e| {
                    matches!(e, Error::Timeout(_))
                })?;
                prop_assert!(started.elapsed() < request_timeout.min(SLACK) + SLACK);
                etcd.close()
                    .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
                return Ok(true);
            }
            Ok(false)
        },
    );
}

/// An endpoint on a loopback host: well formed (the server's port or any
/// port), or with any of its parts mangled.
fn endpoint(port: u16) -> impl Strategy<Value = String> {
    let well_formed = (
        prop::sample::select(vec!["", "http://", " ", "HTTP://"]),
        prop::sample::select(vec!["127.0.0.1", "localhost", "[::1]"]),
        prop_oneof![3 => Just(port), 1 => 1u16..=u16::MAX],
    )
        .prop_map(|(scheme, host, port)| format!("{scheme}{host}:{port}"));
    prop_oneof![1 => well_formed, 1 => mangled_endpoint(port)]
}

/// An endpoint made of loopback hosts and arbitrary other parts.
fn mangled_endpoint(port: u16) -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec![
        "", "", "", "", "http://", "http://", "HTTP://", "https://", "grpc://", "//",
    ]);
    let host = prop::sample::select(vec![
        "127.0.0.1",
        "127.0.0.1",
        "127.0.0.1",
        "localhost",
        "[::1]",
        "[::1",
        "::1",
        "127.1",
        "127.0.0.01",
        "",
    ]);
    let port = prop_oneof![
        8 => Just(port.to_string()),
        2 => any::<u32>().prop_map(|p| p.to_string()),
        1 => (0u32..=70_000).prop_map(|p| p.to_string()),
        1 => "[-+0-9a-z:]{0,7}",
        1 => Just(String::new()),
    ];
    let separator = prop::sample::select(vec![":", ":", ":", ":", ":", "", "::", ": "]);
    let suffix = prop::sample::select(vec![
        "", "", "", "", "", "", "", "", "/", "/v3", "?x", "#f", " ", "\t", "\0", "@x",
    ]);
    (scheme, host, separator, port, suffix)
        .prop_map(|(scheme, host, sep, port, suffix)| format!("{scheme}{host}{sep}{port}{suffix}"))
}

#[test]
fn endpoint_strings_are_ok_or_refused() {
    let server = common::start_etcd();
    let port: u16 = server
        .endpoint()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the server's port");
    let timeout = Duration::from_secs(2);
    let strategy = prop_oneof![
        3 => prop::collection::vec(endpoint(port), 1..=1),
        1 => prop::collection::vec(endpoint(port), 2..=3),
    ];
    check("endpoints", 256, strategy, |endpoints| {
        let options = EtcdOptions::default().with_connect_timeout(timeout);
        let started = Instant::now();
        let result = Etcd::with_options(&endpoints, options);
        let took = started.elapsed();
        typed("connect", &result, &["endpoints"], |e| {
            matches!(e, Error::Connect { .. })
        })?;
        prop_assert!(took < timeout + SLACK, "{endpoints:?}: {took:?}");
        // What the adversary found: a port that is not 1..=65535 is never
        // dialled (it used to become port 80).
        for e in &endpoints {
            let port_text = e
                .trim()
                .trim_start_matches("http://")
                .rsplit_once(':')
                .map(|(_, p)| p.to_string());
            let good_port = port_text.is_some_and(|p| {
                p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|p| p != 0)
            });
            let bad_port = !good_port;
            if bad_port {
                prop_assert!(
                    matches!(
                        result,
                        Err(Error::InvalidArgument {
                            what: "endpoints",
                            ..
                        })
                    ),
                    "{e:?} has no valid port but gave {result:?}"
                );
            }
        }
        let canonical = format!("127.0.0.1:{port}");
        if endpoints
            .iter()
            .all(|e| *e == canonical || *e == format!("http://{canonical}"))
        {
            prop_assert!(result.is_ok(), "{endpoints:?}: {result:?}");
        }
        let parsed = field_of(&result).is_none();
        if let Ok(etcd) = result {
            etcd.close()
                .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
        }
        Ok(parsed)
    });
}

#[test]
fn host_apis_are_ok_or_refused_by_field() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let liveness = (
        prefix(),
        ttl(),
        option_duration(MS, DAY),
        payload(),
        prop::bool::weighted(0.1),
    );
    let watcher = (prefix(), capacity());
    check(
        "HostLiveness",
        192,
        liveness,
        |(prefix, ttl, register_timeout, metadata, nil)| {
            let id = if nil { Uuid::nil() } else { Uuid::new_v4() };
            let options = LivenessOptions::default()
                .with_prefix(prefix.clone())
                .with_ttl(ttl)
                .with_register_timeout(register_timeout);
            let started = Instant::now();
            let result = HostLiveness::with_options(&etcd, id, &metadata, options);
            let took = started.elapsed();
            typed(
                "register",
                &result,
                &["prefix", "ttl", "register_timeout", "metadata", "host_id"],
                // A 1 ms register timeout can pass before etcd answers.
                |e| matches!(e, Error::Timeout(_)),
            )?;
            prop_assert!(took < register_timeout.min(SLACK) + SLACK, "{took:?}");
            if !valid_ttl(ttl) {
                prop_assert!(field_of(&result).is_some(), "ttl {ttl:?} accepted");
            }
            if !in_range(register_timeout, MS, DAY) {
                prop_assert!(
                    field_of(&result).is_some(),
                    "register_timeout {register_timeout:?} accepted"
                );
            }
            if metadata.len() > MAX_PAYLOAD {
                prop_assert!(
                    field_of(&result).is_some(),
                    "{} bytes of metadata accepted",
                    metadata.len()
                );
            }
            if let Ok(host) = result {
                let listed = list_hosts(&etcd, &prefix)
                    .map_err(|e| TestCaseError::fail(format!("list: {e}")))?;
                prop_assert!(listed.iter().any(|h| h.id == id));
                typed(
                    "set_metadata",
                    &host.set_metadata(&metadata),
                    &["metadata"],
                    no_other,
                )?;
                host.close()
                    .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
                return Ok(true);
            }
            Ok(false)
        },
    );
    check("HostWatcher", 96, watcher, |(prefix, capacity)| {
        let listed = list_hosts(&etcd, &prefix);
        typed("list_hosts", &listed, &["prefix"], no_other)?;
        let options = WatcherOptions::default()
            .with_prefix(prefix)
            .with_capacity(capacity);
        let result = HostWatcher::with_options(&etcd, options);
        typed("watch", &result, &["prefix", "capacity"], no_other)?;
        if !(2..=1 << 20).contains(&capacity) {
            prop_assert!(field_of(&result).is_some(), "capacity {capacity} accepted");
        }
        if let (Ok(watcher), Ok(listed)) = (result, listed) {
            // The replay is what list_hosts says, then Synced.
            let mut replayed = 0;
            loop {
                match watcher.events().recv_timeout(SLACK) {
                    Ok(fleetcoord::HostEvent::Up(_)) => replayed += 1,
                    Ok(fleetcoord::HostEvent::Synced) => break,
                    other => prop_assert!(false, "before Synced: {other:?}"),
                }
            }
            prop_assert_eq!(replayed, listed.len());
            return Ok(true);
        }
        Ok(false)
    });
}

#[test]
fn election_apis_are_ok_or_refused_by_field() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    // A leader that stays, so that campaigns on "held" wait and time out.
    let holder = Election::new(&etcd, "held").expect("election");
    let held = holder.campaign(b"holder").expect("campaign");
    let strategy = (name(), prefix(), ttl(), payload(), duration(), 0u64..=300);
    check(
        "Election",
        128,
        strategy,
        |(name, prefix, ttl, value, timeout, wait_ms)| {
            // Half the cases share `etcdctl elect`'s empty prefix.
            let prefix = if wait_ms % 2 == 0 {
                prefix
            } else {
                String::new()
            };
            let options = ElectionOptions::default().with_prefix(prefix).with_ttl(ttl);
            let fields = ["name", "prefix", "ttl"];
            typed(
                "leader_of",
                &Election::leader_of(&etcd, &name, &options),
                &fields,
                no_other,
            )?;
            let observed = Election::observe_of(&etcd, &name, &options);
            typed("observe_of", &observed, &fields, no_other)?;
            let result = Election::with_options(&etcd, &name, options.clone());
            typed("with_options", &result, &fields, no_other)?;
            if name.contains('/') || name.is_empty() {
                prop_assert_eq!(field_of(&result), Some("name"));
            }
            if !valid_ttl(ttl) {
                prop_assert!(field_of(&result).is_some(), "ttl {ttl:?} accepted");
            }
            let Ok(election) = result else {
                return Ok(false);
            };
            let too_big = value.len() > MAX_PAYLOAD;

            // Uncontested: any timeout, Duration::MAX included, returns.
            let started = Instant::now();
            let campaign = election.campaign_timeout(&value, timeout);
            typed("campaign_timeout", &campaign, &["value"], |e| {
                matches!(e, Error::Timeout(_))
            })?;
            prop_assert_eq!(too_big, field_of(&campaign).is_some());
            prop_assert!(started.elapsed() < timeout.min(SLACK) + SLACK);
            if let Ok(leadership) = campaign {
                typed(
                    "proclaim",
                    &leadership.proclaim(&value),
                    &["value"],
                    no_other,
                )?;
                leadership
                    .resign()
                    .map_err(|e| TestCaseError::fail(format!("resign: {e}")))?;
            }
            match election.try_campaign(&value) {
                Ok(TryCampaign::Elected(l)) => l
                    .resign()
                    .map_err(|e| TestCaseError::fail(format!("resign: {e}")))?,
                other => typed("try_campaign", &other, &["value"], no_other)?,
            }
            election
                .close()
                .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;

            // Contested: the wait ends at the timeout, typed.
            let pool = ElectionPool::with_options(&etcd, ElectionOptions::default());
            let wait = Duration::from_millis(wait_ms);
            let started = Instant::now();
            let contested = pool.campaign_timeout("held", &value, wait);
            prop_assert!(
                matches!(
                    contested,
                    Err(Error::Timeout(_)) | Err(Error::InvalidArgument { what: "value", .. })
                ),
                "{contested:?}"
            );
            prop_assert!(started.elapsed() < wait + SLACK);
            typed(
                "pool.try_campaign",
                &pool.try_campaign(&name, b"v"),
                &["name"],
                no_other,
            )?;
            pool.close()
                .map_err(|e| TestCaseError::fail(format!("pool close: {e}")))?;
            Ok(true)
        },
    );
    held.resign().expect("resign");
}

/// One coordinator call, chosen by the strategy.
#[derive(Clone, Debug)]
enum Op {
    Publish(String, Vec<u8>),
    Subscribe(String),
    Append(String, Vec<u8>),
    Read(String, u8),
    Set(String, String, Vec<u8>),
    Get(String, String),
    Delete(String, String),
    Watch(String, String),
}

fn op() -> impl Strategy<Value = Op> {
    let pattern = prop_oneof![
        Just("*".to_string()),
        "[a-z*?]{0,8}",
        name(),
        (1020usize..=1030).prop_map(|n| "*".repeat(n)),
    ];
    prop_oneof![
        (name(), payload()).prop_map(|(t, p)| Op::Publish(t, p)),
        name().prop_map(Op::Subscribe),
        (name(), payload()).prop_map(|(s, p)| Op::Append(s, p)),
        (name(), any::<u8>()).prop_map(|(s, f)| Op::Read(s, f)),
        (name(), name(), payload()).prop_map(|(b, k, v)| Op::Set(b, k, v)),
        (name(), name()).prop_map(|(b, k)| Op::Get(b, k)),
        (name(), name()).prop_map(|(b, k)| Op::Delete(b, k)),
        (name(), pattern).prop_map(|(b, p)| Op::Watch(b, p)),
    ]
}

/// Runs `op`; `Ok(Some(field))` when it was refused for `field`.
fn apply(c: &dyn Coordinator, op: &Op) -> Result<Option<&'static str>, TestCaseError> {
    let fields = [
        "topic", "stream", "bucket", "key", "payload", "value", "pattern",
    ];
    let not_found = |e: &Error| matches!(e, Error::NotFound);
    macro_rules! run {
        ($call:expr, $name:expr, $also:expr) => {{
            let result = $call;
            typed($name, &result, &fields, $also)?;
            Ok(field_of(&result))
        }};
    }
    match op {
        Op::Publish(t, p) => run!(c.publish(t, p), "publish", no_other),
        Op::Subscribe(t) => run!(c.subscribe(t), "subscribe", no_other),
        Op::Append(s, p) => run!(c.append_stream(s, p), "append", no_other),
        Op::Read(s, from) => {
            let from = match from % 3 {
                0 => StreamPosition::Start,
                1 => StreamPosition::End,
                _ => StreamPosition::After(fleetcoord::coordinator::StreamId(u64::from(*from))),
            };
            run!(c.read_stream(s, from), "read_stream", no_other)
        }
        Op::Set(b, k, v) => run!(c.kv_set(b, k, v), "kv_set", no_other),
        Op::Get(b, k) => run!(c.kv_get(b, k), "kv_get", not_found),
        Op::Delete(b, k) => run!(c.kv_delete(b, k), "kv_delete", not_found),
        Op::Watch(b, p) => run!(c.kv_watch(b, p), "kv_watch", no_other),
    }
}

#[test]
fn coordinator_calls_are_ok_or_refused_alike_by_every_backend() {
    let server: EtcdServer = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let memory = MemoryCoordinator::new();
    let on_etcd = EtcdCoordinator::on_etcd(&etcd).expect("coordinator");
    check("Coordinator", 384, op(), |op| {
        let in_memory = apply(&memory, &op)?;
        let in_etcd = apply(&on_etcd, &op)?;
        // One contract: the backends refuse the same inputs, for the same
        // field.
        prop_assert_eq!(in_memory, in_etcd, "{:?}", op);
        Ok(in_etcd.is_none())
    });
    let options = (prefix(), any::<Option<u64>>(), capacity());
    check(
        "EtcdCoordinatorOptions",
        96,
        options,
        |(root, max_len, capacity)| {
            let root = root.trim_end_matches('/').to_string();
            let mut options = EtcdCoordinatorOptions::default()
                .with_root(root)
                .with_feed_capacity(capacity);
            if let Some(n) = max_len {
                options = options.with_stream_max_len(n);
            }
            let result = EtcdCoordinator::on_etcd_with_options(&etcd, options);
            typed(
                "with_options",
                &result,
                &["root", "stream_max_len", "feed_capacity"],
                no_other,
            )?;
            if let Ok(c) = result {
                typed("append", &c.append_stream("s", b"x"), &[], no_other)?;
                c.close()
                    .map_err(|e| TestCaseError::fail(format!("close: {e}")))?;
                return Ok(true);
            }
            Ok(false)
        },
    );
}
