//! Redis Cluster failover and replica confirmations, on real clusters of 3
//! masters with a replica each.
//!
//! * A master is SIGKILLed while writers call `kv_set` and `append_stream`
//!   on names in every master's slot range: the other masters' slots never
//!   fail, the dead master's slots fail over without an error when the
//!   request timeout covers the failover, and otherwise fail within the
//!   request timeout (+1 s) with an error naming the slot and the
//!   failover: retryable when every attempt was refused (nothing stored),
//!   `Indeterminate` for an append one of whose attempts went unanswered;
//!   afterwards every slot is written again.
//! * `with_min_replicas(1, …)`: writes succeed while the replica follows,
//!   fail with the `Unreplicated` kind (stored on the master, not
//!   confirmed) while it is frozen, and succeed again once it resumes.

use fleetcoord::coordinator::redis::RedisOptions;
use fleetcoord::coordinator::{Coordinator, RedisCoordinator, StreamPosition};
use fleetcoord::testing::{RedisCluster, RedisServer};
use fleetcoord::{Error, ErrorKind};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Covers a failover (3.3 s at most measured, with the harness' 1 s
/// `cluster-node-timeout`).
const LONG: Duration = Duration::from_secs(5);
/// Shorter than any failover: the dead master's slots must give up.
const SHORT: Duration = Duration::from_millis(1000);
/// What a call may take beyond its request timeout.
const SLACK: Duration = Duration::from_secs(1);

/// One call's outcome.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    start: Instant,
    took: Duration,
    error: Option<(String, bool)>,
}

/// The slot of `key`, as a running node computes it.
fn keyslot(cluster: &RedisCluster, key: &str) -> u16 {
    (0..cluster.len())
        .filter(|&i| cluster.node(i).pid().is_some())
        .find_map(|i| cluster.node(i).command(&["CLUSTER", "KEYSLOT", key]).ok())
        .expect("CLUSTER KEYSLOT")
        .parse()
        .expect("a slot number")
}

/// Up to `per_master` names served by each master, by master.
fn names_by_master(cluster: &RedisCluster, per_master: usize) -> BTreeMap<usize, Vec<String>> {
    let mut by_master: BTreeMap<usize, Vec<String>> =
        cluster.masters().into_iter().map(|m| (m, vec![])).collect();
    assert_eq!(by_master.len(), 3, "three masters");
    for i in 0..500 {
        let name = format!("n{i}");
        let owner = cluster
            .master_of_slot(keyslot(cluster, &format!("{{{name}}}")))
            .expect("every slot has a master");
        let names = by_master.get_mut(&owner).expect("a master");
        if names.len() < per_master {
            names.push(name);
        }
    }
    assert!(by_master.values().all(|n| n.len() == per_master));
    by_master
}

/// Writers, one thread per name, alternating `kv_set` and `append_stream`
/// with a short pause, until `stop`; neighbouring names start with
/// different calls, so that both kinds are under way when a master dies.
fn writers(
    coord: &Arc<RedisCoordinator>,
    names: &[String],
    stop: &Arc<AtomicBool>,
    calls: &Arc<Mutex<Vec<Call>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    names
        .iter()
        .cloned()
        .enumerate()
        .map(|(n, name)| {
            let (coord, stop, calls) = (coord.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let mut i = n as u64;
                while !stop.load(Ordering::SeqCst) {
                    let start = Instant::now();
                    let result = if i.is_multiple_of(2) {
                        coord.kv_set(&name, "k", i.to_string().as_bytes())
                    } else {
                        coord.append_stream(&name, b"x").map(|_| ())
                    };
                    calls.lock().unwrap().push(Call {
                        name: name.clone(),
                        start,
                        took: start.elapsed(),
                        error: result.err().map(|e| (e.to_string(), e.is_retryable())),
                    });
                    i += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect()
}

#[test]
fn a_killed_master_fails_over_and_only_its_slots_wait() {
    let mut cluster =
        RedisCluster::start_with_replicas(3, 1).expect("start a redis cluster (make deps-redis)");
    let connect = |timeout| {
        Arc::new(
            RedisCoordinator::with_options(
                &cluster.urls(),
                RedisOptions::default().with_request_timeout(timeout),
            )
            .expect("connect"),
        )
    };
    let (patient, impatient) = (connect(LONG), connect(SHORT));
    let by_master = names_by_master(&cluster, 3);
    let (&victim, doomed) = by_master.iter().next().expect("a master");
    let doomed = doomed.clone();
    // The masters a message may name: the dead one, or its replica once
    // the cluster points at it and the request ran out of time meanwhile.
    let named: Vec<String> = std::iter::once(victim)
        .chain(cluster.replicas_of(victim))
        .map(|i| format!("'s master 127.0.0.1:{} ", cluster.node(i).port()))
        .collect();
    assert_eq!(named.len(), 2, "the master has a replica");
    let all: Vec<String> = by_master.values().flatten().cloned().collect();

    let stop = Arc::new(AtomicBool::new(false));
    let patient_calls = Arc::new(Mutex::new(Vec::new()));
    let impatient_calls = Arc::new(Mutex::new(Vec::new()));
    let mut threads = writers(&patient, &all, &stop, &patient_calls);
    threads.extend(writers(&impatient, &doomed, &stop, &impatient_calls));
    std::thread::sleep(Duration::from_millis(500));
    let kill_started = Instant::now();
    cluster.node_mut(victim).kill().expect("kill the master");
    let killed = Instant::now();
    // Until its replica serves the slots, then a while of normal service.
    let deadline = killed + Duration::from_secs(30);
    while doomed
        .iter()
        .any(|n| cluster.master_of_slot(keyslot(&cluster, &format!("{{{n}}}"))) == Some(victim))
    {
        assert!(Instant::now() < deadline, "no replica took over");
        std::thread::sleep(Duration::from_millis(100));
    }
    let failed_over = killed.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("writer thread");
    }
    eprintln!("replica took over {failed_over:?} after the kill");

    // Every call of either handle returned within its timeout + slack.
    for (calls, timeout) in [(&patient_calls, LONG), (&impatient_calls, SHORT)] {
        for call in calls.lock().unwrap().iter() {
            assert!(
                call.took <= timeout + SLACK,
                "{} took {:?} (timeout {timeout:?}): {:?}",
                call.name,
                call.took,
                call.error
            );
        }
    }

    // The patient handle outwaits the failover: no call fails, neither on
    // the healthy masters nor on the dead one's slots.
    let patient_calls = patient_calls.lock().unwrap().clone();
    let failures: Vec<&Call> = patient_calls.iter().filter(|c| c.error.is_some()).collect();
    let in_flight = |c: &Call| c.start <= killed && c.start + c.took >= kill_started;
    for call in &failures {
        let (text, _) = call.error.as_ref().expect("failed");
        // Only an append on the dead master at the moment of the kill may
        // fail, saying its outcome is unknown.
        assert!(
            in_flight(call)
                && doomed.contains(&call.name)
                && text.contains("may or may not have been applied"),
            "{} failed: {text}",
            call.name
        );
    }
    let slowest_healthy = patient_calls
        .iter()
        .filter(|c| !doomed.contains(&c.name))
        .map(|c| c.took)
        .max()
        .expect("calls");
    let slowest_doomed = patient_calls
        .iter()
        .filter(|c| doomed.contains(&c.name))
        .map(|c| c.took)
        .max()
        .expect("calls");
    eprintln!(
        "5 s timeout: slowest call on a healthy master {slowest_healthy:?}, \
         on the dead master's slots {slowest_doomed:?}"
    );

    // The impatient handle gives up on the dead master's slots, saying so.
    let impatient_calls = impatient_calls.lock().unwrap().clone();
    let mut gave_up = 0;
    let mut appends_refused = 0;
    for call in &impatient_calls {
        let Some((text, retryable)) = &call.error else {
            continue;
        };
        let unknown = text.contains("may or may not have been applied");
        if in_flight(call) && unknown {
            continue;
        }
        let append = text.contains("append to stream");
        let slot = if append {
            keyslot(&cluster, &format!("coord:stream:{{{}}}", call.name))
        } else {
            keyslot(&cluster, &format!("coord:kv:{{{}}}", call.name))
        };
        if unknown {
            // An attempt went unanswered: only an append says so, and it
            // is not retryable (it may be stored).
            assert!(append && !*retryable, "{} failed: {text}", call.name);
        } else {
            // Every attempt was refused: nothing stored, retry.
            assert!(*retryable, "{text}");
            appends_refused += usize::from(append);
        }
        assert!(
            text.contains(&format!("slot {slot}"))
                && text.contains("failover in progress (gave up after"),
            "{} failed: {text}",
            call.name
        );
        // When the message names the master it waited for, it is the dead
        // one or its successor.
        if text.contains("'s master 127.") {
            assert!(named.iter().any(|n| text.contains(n)), "{text}");
        }
        assert!(!text.contains('\n'), "one line: {text}");
        gave_up += 1;
    }
    assert!(gave_up > 0, "a 1 s timeout never gave up on a failover");
    // Attempts on the dead master's slots are refused (MOVED to it,
    // CLUSTERDOWN) until its replica takes over: an append that met only
    // refusals must say "not stored", not "unknown".
    assert!(
        appends_refused > 0,
        "no append that gave up on the failover was retryable"
    );
    let sample = impatient_calls.iter().find_map(|c| c.error.clone());
    eprintln!("1 s timeout: {gave_up} calls gave up, e.g. {sample:?}");

    // Liveness: after the failover every name is written again by both.
    for calls in [&patient_calls, &impatient_calls] {
        let mut last: BTreeMap<&str, &Call> = BTreeMap::new();
        for call in calls.iter() {
            last.insert(&call.name, call);
        }
        assert!(last.len() >= doomed.len());
        for (name, call) in last {
            assert!(call.error.is_none(), "{name}'s last call failed: {call:?}");
        }
    }
    // The appends that succeeded are all there, once each.
    for name in &all {
        let reader = patient
            .read_stream(name, StreamPosition::Start)
            .expect("read");
        let mut ids = Vec::new();
        while let Ok(entry) = reader.recv_timeout(Duration::from_millis(300)) {
            ids.push(entry.id.0);
        }
        assert!(!ids.is_empty(), "{name}: appends were read");
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "{name}: ids in order, no repeats"
        );
    }
}

fn unreplicated(e: &Error) -> Option<&str> {
    match e {
        Error::Backend {
            kind: ErrorKind::Unreplicated,
            message,
            ..
        } => Some(message),
        _ => None,
    }
}

#[test]
fn min_replicas_confirms_writes_and_says_when_a_replica_does_not() {
    let cluster =
        RedisCluster::start_with_replicas(3, 1).expect("start a redis cluster (make deps-redis)");
    let confirm = Duration::from_secs(1);
    let coord = RedisCoordinator::with_options(
        &cluster.urls(),
        RedisOptions::default().with_min_replicas(1, confirm),
    )
    .expect("connect");
    let by_master = names_by_master(&cluster, 1);
    let (&master, names) = by_master.iter().next().expect("a master");
    let name = names[0].clone();
    let replica = *cluster
        .replicas_of(master)
        .first()
        .expect("the master has a replica");

    // With the replica following, writes are confirmed.
    coord.kv_set(&name, "k", b"v1").expect("confirmed set");
    let first = coord.append_stream(&name, b"e1").expect("confirmed append");
    coord.kv_delete(&name, "k").expect("confirmed delete");

    cluster.node(replica).pause().expect("SIGSTOP the replica");
    let frozen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let started = Instant::now();
        let e = coord.kv_set(&name, "k", b"v2").expect_err("unconfirmed");
        let took = started.elapsed();
        let text = unreplicated(&e).unwrap_or_else(|| panic!("not Unreplicated: {e}"));
        assert!(
            text.contains("applied on the master but confirmed by 0 of 1 replicas"),
            "{text}"
        );
        assert!(!e.is_retryable(), "applied already: {e}");
        assert!(took >= confirm && took < confirm + SLACK, "took {took:?}");
        // Stored, as the error says.
        assert_eq!(coord.kv_get(&name, "k").expect("get"), b"v2");

        let e = coord.append_stream(&name, b"e2").expect_err("unconfirmed");
        let text = unreplicated(&e).unwrap_or_else(|| panic!("not Unreplicated: {e}"));
        let id = format!("0-{}", first.0 + 1);
        assert!(
            text.contains(&format!("applied on the master as {id} but")),
            "{text}"
        );
        // A watch-free read sees the stored entry.
        let reader = coord
            .read_stream(&name, StreamPosition::Start)
            .expect("read");
        let got: Vec<Vec<u8>> = (0..2)
            .map(|_| {
                reader
                    .recv_timeout(Duration::from_secs(5))
                    .expect("entry")
                    .payload
            })
            .collect();
        assert_eq!(got, [b"e1".to_vec(), b"e2".to_vec()]);
        // Publish is not followed by WAIT: it is never stored.
        coord.publish(&name, b"hello").expect("publish");
    }));
    cluster.node(replica).resume().expect("SIGCONT the replica");
    if let Err(panic) = frozen {
        std::panic::resume_unwind(panic);
    }
    // Once the replica is back, writes are confirmed again (it may first
    // need to reconnect to its master).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match coord.kv_set(&name, "k", b"v3") {
            Ok(()) => break,
            Err(e) if unreplicated(&e).is_some() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("not confirmed after the replica resumed: {e}"),
        }
    }
    coord.append_stream(&name, b"e3").expect("confirmed append");
}

#[test]
fn min_replicas_on_a_server_without_replicas_fails_typed_and_bounded() {
    let server = RedisServer::start().expect("start redis-server (make deps-redis)");
    let coord = RedisCoordinator::with_options(
        &server.url(),
        RedisOptions::default().with_min_replicas(1, Duration::from_millis(200)),
    )
    .expect("connect");
    let started = Instant::now();
    let e = coord.kv_set("b", "k", b"v").expect_err("no replica");
    assert!(started.elapsed() < Duration::from_millis(200) + SLACK);
    let text = unreplicated(&e).unwrap_or_else(|| panic!("not Unreplicated: {e}"));
    assert!(
        text.contains(r#"set "k" in bucket "b": applied on the master but confirmed by 0 of 1"#),
        "{text}"
    );
    assert_eq!(coord.kv_get("b", "k").expect("stored"), b"v");
    // A delete of a missing key writes nothing: nothing to confirm.
    coord.kv_delete("b", "missing").expect("nothing written");
    // Reads and pings are not writes.
    coord.ping().expect("ping");
    // Out of range options are refused before connecting, naming the field.
    for (options, field) in [
        (
            RedisOptions::default().with_min_replicas(0, Duration::from_secs(1)),
            "min_replicas",
        ),
        (
            RedisOptions::default().with_min_replicas(1, Duration::from_secs(10)),
            "min_replicas_timeout",
        ),
    ] {
        match RedisCoordinator::with_options(&server.url(), options) {
            Err(Error::InvalidArgument { what, .. }) => assert_eq!(what, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

/// Per counter: wins, conflicts, unknown outcomes.
type Outcomes = (u64, u64, u64);

/// Compare-and-set increments through a master's kill: two threads per
/// counter, on counters in every master's slots, through a handle whose
/// request timeout covers the failover. A win is counted only when
/// reported; a conditional set whose answer was lost is retried with its
/// token (applied once, answered as applied) or said to be
/// `KvIndeterminate`. So every counter ends between its wins and its wins
/// plus its unknown outcomes: below would be a win that did not apply,
/// above a conflict reported for a write that did (the caller then
/// increments twice).
#[test]
fn cas_increments_through_a_master_kill_are_never_false_wins() {
    let mut cluster =
        RedisCluster::start_with_replicas(3, 1).expect("start a redis cluster (make deps-redis)");
    let coord = Arc::new(
        RedisCoordinator::with_options(
            &cluster.urls(),
            RedisOptions::default().with_request_timeout(LONG),
        )
        .expect("connect"),
    );
    let by_master = names_by_master(&cluster, 2);
    let (&victim, _) = by_master.iter().next().expect("a master");
    let all: Vec<String> = by_master.values().flatten().cloned().collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tally: Arc<Mutex<BTreeMap<String, Outcomes>>> = Arc::default();
    let threads: Vec<_> = all
        .iter()
        .flat_map(|name| [name.clone(), name.clone()])
        .map(|name| {
            let (coord, stop, tally) = (coord.clone(), stop.clone(), tally.clone());
            std::thread::spawn(move || {
                let (mut wins, mut conflicts, mut unknown) = (0, 0, 0);
                while !stop.load(Ordering::SeqCst) {
                    let (n, revision) = match coord.kv_get_entry(&name, "n") {
                        Ok(e) => (
                            String::from_utf8(e.value).unwrap().parse::<u64>().unwrap(),
                            e.revision,
                        ),
                        Err(Error::NotFound) => (0, 0),
                        Err(e) => panic!("{name}: kv_get_entry through a failover: {e}"),
                    };
                    match coord.kv_set_if(&name, "n", (n + 1).to_string().as_bytes(), revision) {
                        Ok(_) => wins += 1,
                        Err(Error::Conflict { .. }) => conflicts += 1,
                        Err(Error::KvIndeterminate { .. }) => unknown += 1,
                        Err(e) => panic!("{name}: kv_set_if through a failover: {e}"),
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let mut tally = tally.lock().unwrap();
                let t = tally.entry(name).or_default();
                t.0 += wins;
                t.1 += conflicts;
                t.2 += unknown;
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    cluster.node_mut(victim).kill().expect("kill the master");
    let killed = Instant::now();
    while all
        .iter()
        .any(|n| cluster.master_of_slot(keyslot(&cluster, &format!("{{{n}}}"))) == Some(victim))
    {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no replica took over"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("a CAS thread panicked");
    }
    let tally = tally.lock().unwrap();
    let (mut wins, mut conflicts, mut unknown) = (0, 0, 0);
    for (name, (w, c, u)) in tally.iter() {
        let end: u64 = String::from_utf8(coord.kv_get(name, "n").expect("kv_get"))
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            *w <= end && end <= w + u,
            "{name}: ends at {end} after {w} wins and {u} unknown outcomes ({c} conflicts)"
        );
        (wins, conflicts, unknown) = (wins + w, conflicts + c, unknown + u);
    }
    assert!(wins > 0);
    eprintln!(
        "through the failover: {wins} wins, {conflicts} conflicts, {unknown} unknown outcomes \
         on {} counters",
        tally.len()
    );
}
