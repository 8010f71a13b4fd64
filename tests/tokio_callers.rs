//! Blocking calls made from inside a tokio runtime, one test per primitive
//! family, against real servers: from a thread that runs the runtime's
//! tasks (a current-thread runtime's `block_on` and tasks, a multi-thread
//! worker) every call fails at once with `Error::InsideAsyncRuntime`; from
//! `spawn_blocking` (both flavours) and `block_in_place` every call works.
//! Nothing panics, nothing deadlocks (a watchdog bounds each context), and
//! objects dropped inside the runtime (the last `Etcd` clone among them)
//! do not block it. The tests run in debug builds, where the old check was
//! a `debug_assert!` that panicked; release builds take the same path.

mod common;

use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, NatsCoordinator, RedisCoordinator, StreamPosition,
};
use fleetcoord::testing::{NatsServer, RedisServer};
use fleetcoord::{
    list_hosts, Election, ElectionPool, Error, ErrorKind, Etcd, HostLiveness, HostWatcher, Mutex,
    Semaphore, Session, ShardMap, ShardOptions, DEFAULT_HOSTS_PREFIX,
};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// A context that deadlocks fails the test after this, instead of hanging.
const WATCHDOG: Duration = Duration::from_secs(30);
/// A refused call returns at once: no request, no wait. Generous for a
/// loaded 2-core machine; the refusals take microseconds.
const REFUSED_WITHIN: Duration = Duration::from_millis(200);
const TTL: Duration = Duration::from_secs(5);

/// Where a call is made from.
#[derive(Clone, Copy, Debug)]
enum Caller {
    /// The future of a current-thread runtime's `block_on`.
    CurrentThreadBlockOn,
    /// A task spawned on a current-thread runtime.
    CurrentThreadTask,
    /// `spawn_blocking` of a current-thread runtime.
    CurrentThreadSpawnBlocking,
    /// A task on a multi-thread runtime's worker.
    MultiThreadWorker,
    /// `block_in_place` inside such a task.
    MultiThreadBlockInPlace,
    /// `spawn_blocking` of a multi-thread runtime.
    MultiThreadSpawnBlocking,
}

const CALLERS: [Caller; 6] = [
    Caller::CurrentThreadBlockOn,
    Caller::CurrentThreadTask,
    Caller::CurrentThreadSpawnBlocking,
    Caller::MultiThreadWorker,
    Caller::MultiThreadBlockInPlace,
    Caller::MultiThreadSpawnBlocking,
];

impl Caller {
    /// Whether blocking calls work from here (else they are refused).
    fn works(self) -> bool {
        matches!(
            self,
            Caller::CurrentThreadSpawnBlocking
                | Caller::MultiThreadBlockInPlace
                | Caller::MultiThreadSpawnBlocking
        )
    }

    /// Runs `f` from this context and returns its output, or panics when
    /// the context does not finish within [`WATCHDOG`] (a deadlock).
    fn run<T: Send + 'static>(self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::Builder::new()
            .name(format!("{self:?}"))
            .spawn(move || {
                let out = self.run_here(f);
                let _ = tx.send(out);
            })
            .expect("spawn");
        match rx.recv_timeout(WATCHDOG) {
            Ok(out) => out,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                panic!("{self:?}: no answer within {WATCHDOG:?}: deadlocked")
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                panic!("{self:?}: the calling thread panicked")
            }
        }
    }

    fn run_here<T: Send + 'static>(self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let current = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
        };
        let multi = || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime")
        };
        match self {
            Caller::CurrentThreadBlockOn => current().block_on(async move { f() }),
            Caller::CurrentThreadTask => current()
                .block_on(async move { tokio::spawn(async move { f() }).await })
                .expect("task"),
            Caller::CurrentThreadSpawnBlocking => current()
                .block_on(async move { tokio::task::spawn_blocking(f).await })
                .expect("task"),
            Caller::MultiThreadWorker => multi()
                .block_on(async move { tokio::spawn(async move { f() }).await })
                .expect("task"),
            Caller::MultiThreadBlockInPlace => multi()
                .block_on(async move {
                    tokio::spawn(async move { tokio::task::block_in_place(f) }).await
                })
                .expect("task"),
            Caller::MultiThreadSpawnBlocking => multi()
                .block_on(async move { tokio::task::spawn_blocking(f).await })
                .expect("task"),
        }
    }
}

/// The outcome of each call of a family, named.
type Calls = Vec<(&'static str, fleetcoord::Result<()>)>;

/// Runs `calls` on what `prepare` made (on a plain thread) from every
/// context, and checks each call: refused at once with
/// [`Error::InsideAsyncRuntime`] where blocking is not allowed, `Ok`
/// elsewhere.
fn check_family<P: Send + 'static>(family: &str, prepare: impl Fn() -> P, calls: fn(P) -> Calls) {
    for caller in CALLERS {
        let prepared = prepare();
        let started = Instant::now();
        let outcomes = caller.run(move || {
            let started = Instant::now();
            let outcomes = calls(prepared);
            // Includes dropping what was prepared, inside the context.
            (outcomes, started.elapsed())
        });
        let (outcomes, inside) = outcomes;
        println!(
            "{family} from {caller:?}: {} calls in {inside:?} ({:?} with the runtime)",
            outcomes.len(),
            started.elapsed()
        );
        for (call, outcome) in outcomes {
            if caller.works() {
                if let Err(e) = outcome {
                    panic!("{family}: {call} from {caller:?} failed: {e}");
                }
            } else {
                match outcome {
                    Err(e @ Error::InsideAsyncRuntime) => {
                        assert_eq!(e.kind(), ErrorKind::InsideAsyncRuntime);
                        assert!(!e.is_retryable());
                        assert!(e.to_string().contains("spawn_blocking"), "{e}");
                    }
                    other => panic!(
                        "{family}: {call} from {caller:?}: {other:?}, not InsideAsyncRuntime"
                    ),
                }
            }
        }
        if !caller.works() {
            assert!(
                inside < REFUSED_WITHIN,
                "{family} from {caller:?}: refusing took {inside:?}"
            );
        }
    }
}

fn ok<T>(r: fleetcoord::Result<T>) -> fleetcoord::Result<()> {
    r.map(|_| ())
}

#[test]
fn etcd_handle_and_host_reads() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    check_family(
        "Etcd",
        || (endpoint.clone(), common::connect(&endpoint)),
        |(endpoint, etcd)| {
            vec![
                ("Etcd::connect", ok(Etcd::connect(&[endpoint.as_str()]))),
                ("Etcd::lease_ttl", ok(etcd.lease_ttl(1))),
                ("list_hosts", ok(list_hosts(&etcd, DEFAULT_HOSTS_PREFIX))),
                ("Etcd::close", etcd.close()),
                // `etcd`, the last clone, is dropped here, in the context.
            ]
        },
    );
}

#[test]
fn liveness_watcher_and_session() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    check_family(
        "HostLiveness",
        || {
            let host = HostLiveness::register(&etcd, Uuid::new_v4(), b"{}", TTL).expect("register");
            let watcher = HostWatcher::watch(&etcd).expect("watch");
            let session = Session::new(&etcd, TTL).expect("session");
            (etcd.clone(), host, watcher, session)
        },
        |(etcd, host, watcher, session)| {
            vec![
                (
                    "HostLiveness::register",
                    ok(HostLiveness::register(&etcd, Uuid::new_v4(), b"{}", TTL)),
                ),
                (
                    "HostLiveness::set_metadata",
                    host.set_metadata(b"{\"x\":1}"),
                ),
                ("HostLiveness::close", host.close()),
                ("HostWatcher::watch", ok(HostWatcher::watch(&etcd))),
                ("HostWatcher::close", watcher.close()),
                ("Session::new", ok(Session::new(&etcd, TTL))),
                ("Session::close", session.close()),
            ]
        },
    );
}

#[test]
fn elections_locks_semaphores_and_pools() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    check_family(
        "Election",
        || {
            let name = Uuid::new_v4().to_string();
            let election = Election::new(&etcd, &name).expect("election");
            let leadership = election.campaign(b"first").expect("campaign");
            let mutex = Mutex::new(&etcd, &name).expect("mutex");
            let semaphore = Semaphore::new(&etcd, &name, 2).expect("semaphore");
            let pool = ElectionPool::new(&etcd);
            (
                etcd.clone(),
                name,
                election,
                leadership,
                mutex,
                semaphore,
                pool,
            )
        },
        |(etcd, name, election, leadership, mutex, semaphore, pool)| {
            vec![
                ("Election::new", ok(Election::new(&etcd, &name))),
                ("Election::leader", ok(election.leader())),
                ("Leadership::proclaim", leadership.proclaim(b"second")),
                ("Leadership::resign", leadership.resign()),
                (
                    "Election::try_campaign",
                    ok(election.try_campaign(b"again")),
                ),
                ("Election::close", election.close()),
                ("Mutex::lock", mutex.lock().and_then(|guard| guard.unlock())),
                ("Mutex::try_lock", ok(mutex.try_lock())),
                (
                    "Semaphore::acquire",
                    semaphore.acquire().and_then(|g| g.release()),
                ),
                (
                    "ElectionPool::campaign",
                    ok(pool.campaign(&name, b"pooled")),
                ),
                ("ElectionPool::close", pool.close()),
            ]
        },
    );
}

#[test]
fn shard_maps() {
    let server = common::start_etcd();
    let etcd = common::connect(&server.endpoint());
    let options = || {
        ShardOptions::default()
            .with_member(Uuid::new_v4().to_string())
            .with_ttl(TTL)
    };
    check_family(
        "ShardMap",
        || {
            let name = Uuid::new_v4().to_string();
            let map = ShardMap::join(&etcd, &name, 2, options()).expect("join");
            (etcd.clone(), name, map, options())
        },
        |(etcd, name, map, other)| {
            vec![
                ("ShardMap::join", ok(ShardMap::join(&etcd, &name, 2, other))),
                ("ShardMap::owner_of", ok(map.owner_of(0))),
                (
                    "ShardMap::members_of",
                    ok(ShardMap::members_of(&etcd, &name, &ShardOptions::default())),
                ),
                ("ShardMap::leave", map.leave()),
            ]
        },
    );
}

/// The calls of the bus every backend shares.
fn bus_calls(coord: Box<dyn Coordinator>) -> Calls {
    let topic = "t";
    vec![
        ("publish", coord.publish(topic, b"x")),
        ("subscribe", ok(coord.subscribe(topic))),
        ("append_stream", ok(coord.append_stream("s", b"x"))),
        (
            "read_stream",
            ok(coord.read_stream("s", StreamPosition::Start)),
        ),
        ("kv_set", coord.kv_set("b", "k", b"v")),
        ("kv_get", ok(coord.kv_get("b", "k"))),
        ("kv_watch", ok(coord.kv_watch("b", "*"))),
        ("kv_delete", coord.kv_delete("b", "k")),
        ("ping", coord.ping()),
        // `coord` is dropped here, inside the context.
    ]
}

#[test]
fn the_etcd_bus() {
    let server = common::start_etcd();
    let endpoint = server.endpoint();
    check_family(
        "EtcdCoordinator",
        || {
            let coord = EtcdCoordinator::connect(&[endpoint.as_str()]).expect("connect");
            (endpoint.clone(), Box::new(coord) as Box<dyn Coordinator>)
        },
        |(endpoint, coord)| {
            let mut calls = vec![(
                "EtcdCoordinator::connect",
                ok(EtcdCoordinator::connect(&[endpoint.as_str()])),
            )];
            calls.extend(bus_calls(coord));
            calls
        },
    );
}

#[test]
fn the_redis_bus() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let url = server.url();
    check_family(
        "RedisCoordinator",
        || {
            let coord = RedisCoordinator::connect(&url).expect("connect");
            (url.clone(), Box::new(coord) as Box<dyn Coordinator>)
        },
        |(url, coord)| {
            let mut calls = vec![(
                "RedisCoordinator::connect",
                ok(RedisCoordinator::connect(&url)),
            )];
            calls.extend(bus_calls(coord));
            calls
        },
    );
}

#[test]
fn the_nats_bus() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats` installs it)");
    let url = server.url();
    check_family(
        "NatsCoordinator",
        || {
            let coord = NatsCoordinator::connect(&url).expect("connect");
            (url.clone(), Box::new(coord) as Box<dyn Coordinator>)
        },
        |(url, coord)| {
            let mut calls = vec![(
                "NatsCoordinator::connect",
                ok(NatsCoordinator::connect(&url)),
            )];
            calls.extend(bus_calls(coord));
            calls
        },
    );
}
