//! Compare-and-set whose answers are lost: threads increment one counter
//! with `kv_set_if` while every connection to the server is cut again
//! and again (etcd behind a fault proxy that resets them, Redis killing
//! its clients). A cut lands between sending a conditional set and its
//! answer often enough; the backend must then either learn the outcome
//! (Redis retries with the write's token) or say `KvIndeterminate`
//! (etcd), and never count a write twice or a write that did not apply.
//! So the counter ends between the wins and the wins plus the unknown
//! outcomes: below would be a win that did not apply, above a write that
//! applied and was reported as a conflict or a retryable failure.

mod common;

use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, RedisCoordinator};
use fleetcoord::testing::{FaultProxy, RedisServer};
use fleetcoord::{Error, Etcd, EtcdOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: usize = 4;
const RUN: Duration = Duration::from_secs(4);
const CUT_EVERY: Duration = Duration::from_millis(40);

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    wins: u64,
    conflicts: u64,
    unknown: u64,
    /// Retryable failures: not applied, by the error contract.
    failed: u64,
}

/// Runs the increments on `handles` while `cut` runs every
/// [`CUT_EVERY`]; checks the counter against the tally and returns it.
fn increments_under_cuts(handles: Vec<Arc<dyn Coordinator>>, cut: impl Fn()) -> Tally {
    let bucket = format!("cas-faults-{}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = handles
        .iter()
        .cloned()
        .map(|c| {
            let (stop, bucket) = (stop.clone(), bucket.clone());
            std::thread::spawn(move || {
                let mut t = Tally::default();
                while !stop.load(Ordering::SeqCst) {
                    let (n, revision) = match c.kv_get_entry(&bucket, "n") {
                        Ok(e) => (
                            String::from_utf8(e.value)
                                .expect("text")
                                .parse::<u64>()
                                .expect("a count"),
                            e.revision,
                        ),
                        Err(Error::NotFound) => (0, 0),
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => panic!("kv_get_entry: {e}"),
                    };
                    match c.kv_set_if(&bucket, "n", (n + 1).to_string().as_bytes(), revision) {
                        Ok(_) => t.wins += 1,
                        Err(Error::Conflict { .. }) => t.conflicts += 1,
                        Err(Error::KvIndeterminate { .. }) => t.unknown += 1,
                        Err(e) if e.is_retryable() => t.failed += 1,
                        Err(e) => panic!("kv_set_if: neither a result nor retryable: {e}"),
                    }
                }
                t
            })
        })
        .collect();
    let began = Instant::now();
    while began.elapsed() < RUN {
        std::thread::sleep(CUT_EVERY);
        cut();
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = Tally::default();
    for t in threads {
        let t = t.join().expect("an increment thread panicked");
        total.wins += t.wins;
        total.conflicts += t.conflicts;
        total.unknown += t.unknown;
        total.failed += t.failed;
    }
    let end = loop {
        match handles[0].kv_get(&bucket, "n") {
            Ok(v) => {
                break String::from_utf8(v)
                    .expect("text")
                    .parse::<u64>()
                    .expect("a count")
            }
            Err(e) if e.is_retryable() => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("kv_get: {e}"),
        }
    };
    assert!(
        total.wins <= end && end <= total.wins + total.unknown,
        "the counter is {end} after {total:?}"
    );
    assert!(total.wins > 0, "{total:?}");
    total
}

#[test]
fn etcd_cas_with_lost_answers_is_never_a_false_win() {
    let etcd = common::start_etcd();
    let proxy = FaultProxy::start(&etcd.endpoint()).expect("proxy");
    let handles: Vec<Arc<dyn Coordinator>> = (0..THREADS)
        .map(|_| {
            let client = Etcd::with_options(&[proxy.endpoint()], EtcdOptions::default())
                .expect("connect through the proxy");
            Arc::new(EtcdCoordinator::on_etcd(&client).expect("coordinator"))
                as Arc<dyn Coordinator>
        })
        .collect();
    let tally = increments_under_cuts(handles, || {
        proxy.reset_all();
    });
    eprintln!("etcd, connections reset every {CUT_EVERY:?}: {tally:?}");
}

#[test]
fn redis_cas_with_lost_answers_is_never_a_false_win() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    let url = server.url();
    let handles: Vec<Arc<dyn Coordinator>> = (0..THREADS)
        .map(|_| {
            Arc::new(RedisCoordinator::connect(&url).expect("connect")) as Arc<dyn Coordinator>
        })
        .collect();
    let tally = increments_under_cuts(handles, || {
        let _ = server.command(&["CLIENT", "KILL", "TYPE", "normal"]);
    });
    eprintln!("redis, clients killed every {CUT_EVERY:?}: {tally:?}");
}

/// A conditional set sent to a NATS server that stops answering (paused
/// longer than one attempt, so the set is sent again) applies once and is
/// answered as the win it is: nats-server 2.9 answers the repeat as a
/// duplicate, 2.11 and later refuse it on its expected sequence, and the
/// backend then finds its own message at the key's head.
#[test]
fn nats_cas_sent_twice_through_a_pause_is_one_win() {
    use fleetcoord::coordinator::{NatsCoordinator, NatsOptions};
    use fleetcoord::testing::NatsServer;
    let server = NatsServer::start().expect("start nats-server (make deps-nats)");
    let options = NatsOptions::default().with_request_timeout(Duration::from_secs(8));
    let coord = NatsCoordinator::with_options(&server.url(), options).expect("connect");
    let mut revision = coord.kv_set_if("locks", "owner", b"0", 0).expect("claim");
    for round in 1..=3u64 {
        server.pause().expect("pause");
        let resume = std::thread::spawn({
            let pid = server.pid();
            move || {
                // Longer than one publish attempt (2 s): the set is sent again.
                std::thread::sleep(Duration::from_millis(2600));
                pid
            }
        });
        let value = round.to_string();
        let set = std::thread::scope(|s| {
            let call = s.spawn(|| coord.kv_set_if("locks", "owner", value.as_bytes(), revision));
            resume.join().expect("timer");
            server.resume().expect("resume");
            call.join().expect("kv_set_if")
        });
        let entry = coord.kv_get_entry("locks", "owner").expect("kv_get_entry");
        match set {
            Ok(won) => {
                assert_eq!((entry.value, entry.revision), (value.into_bytes(), won));
                revision = won;
            }
            Err(Error::KvIndeterminate { .. }) => revision = entry.revision,
            Err(e) => panic!("round {round}: a set sent twice must not be {e}"),
        }
    }
}
