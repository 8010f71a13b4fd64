//! The two end-to-end scenarios of the Coordinator, on every networked
//! backend: two coordinator instances with their own connections stand in
//! for two containers.
//!
//! * KV invalidation (FlowPublishInvalidation): B mirrors a bucket A
//!   writes, through `kv_watch`.
//! * Stream fan-out (LiveMetricsFanout): a producer appends while consumers
//!   from the end and from the start read every entry, in order, exactly
//!   once.
//!
//! The scenarios are written once against `dyn Coordinator`; each test only
//! starts its server and opens the two containers.

use fleetcoord::coordinator::{
    Coordinator, EtcdCoordinator, KvEvent, NatsCoordinator, RedisCoordinator, StreamPosition,
};
use fleetcoord::testing::{EtcdServer, NatsServer, RedisCluster, RedisServer};
use fleetcoord::{Etcd, EtcdOptions};
use std::time::Duration;

// Delivery takes milliseconds; the bound only guards against a hang on a
// loaded CI machine.
const WAIT: Duration = Duration::from_secs(10);

/// Entries appended before the readers start, and while they read.
const EARLY: u64 = 5;
const LATE: u64 = 300;

fn kv_invalidation(a: &dyn Coordinator, b: &dyn Coordinator) {
    a.kv_set("fleet", "existing", b"1").unwrap();
    let watch = b.kv_watch("fleet", "*").unwrap();
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Put {
            key: "existing".into(),
            value: b"1".to_vec()
        }
    );
    assert_eq!(watch.recv_timeout(WAIT).unwrap(), KvEvent::Synced);
    a.kv_set("fleet", "leader", b"host-a").unwrap();
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Put {
            key: "leader".into(),
            value: b"host-a".to_vec()
        }
    );
    // Deleting a missing key tells nobody anything; the next delete shows
    // it did not even queue a notification.
    a.kv_delete("fleet", "never-set").unwrap();
    a.kv_delete("fleet", "leader").unwrap();
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Deleted {
            key: "leader".into()
        }
    );
    assert_eq!(b.kv_get("fleet", "existing").unwrap(), b"1".to_vec());
    assert!(matches!(
        b.kv_get("fleet", "leader"),
        Err(fleetcoord::Error::NotFound)
    ));
}

fn stream_fan_out(producer: Box<dyn Coordinator>, consumer: &dyn Coordinator) {
    for i in 0..EARLY {
        producer
            .append_stream("metrics", format!("early-{i}").as_bytes())
            .unwrap();
    }
    let from_end = consumer
        .read_stream("metrics", StreamPosition::End)
        .unwrap();
    let from_start = consumer
        .read_stream("metrics", StreamPosition::Start)
        .unwrap();
    let producer_thread = std::thread::spawn(move || {
        (0..LATE)
            .map(|i| {
                producer
                    .append_stream("metrics", format!("late-{i}").as_bytes())
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    let ids = producer_thread.join().unwrap();
    let expected_late: Vec<Vec<u8>> = (0..LATE)
        .map(|i| format!("late-{i}").into_bytes())
        .collect();
    assert_eq!(ids.first().map(|id| id.0), Some(EARLY + 1));
    assert_eq!(ids.last().map(|id| id.0), Some(EARLY + LATE));

    let end: Vec<_> = (0..LATE)
        .map(|_| from_end.recv_timeout(WAIT).expect("entry from End reader"))
        .collect();
    assert_eq!(
        end.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids,
        "the End reader sees exactly the entries appended after it started"
    );
    assert_eq!(
        end.into_iter().map(|e| e.payload).collect::<Vec<_>>(),
        expected_late
    );

    for expected_id in 1..=EARLY + LATE {
        let e = from_start
            .recv_timeout(WAIT)
            .expect("entry from Start reader");
        assert_eq!(e.id.0, expected_id);
        let expected = match expected_id.checked_sub(EARLY + 1) {
            Some(late) => expected_late[late as usize].clone(),
            None => format!("early-{}", expected_id - 1).into_bytes(),
        };
        assert_eq!(e.payload, expected);
    }
    assert!(from_start.recv_timeout(Duration::from_millis(200)).is_err());
    assert!(from_end.recv_timeout(Duration::from_millis(200)).is_err());
}

/// Both scenarios, each with two fresh containers from `open`.
fn scenarios(open: impl Fn() -> Box<dyn Coordinator>) {
    kv_invalidation(open().as_ref(), open().as_ref());
    stream_fan_out(open(), open().as_ref());
}

#[test]
fn on_etcd() {
    let server = EtcdServer::start().expect("start etcd (run `make test` to install it)");
    scenarios(|| {
        let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
        Box::new(EtcdCoordinator::on_etcd(&etcd).expect("coordinator"))
    });
}

#[test]
fn on_nats() {
    let server = NatsServer::start().expect("start nats-server (run `make deps-nats`)");
    scenarios(|| Box::new(NatsCoordinator::connect(&server.url()).expect("connect")));
}

#[test]
fn on_redis() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    scenarios(|| Box::new(RedisCoordinator::connect(&server.url()).expect("connect")));
}

#[test]
fn on_a_redis_cluster() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster (run `make deps-redis`)");
    scenarios(|| Box::new(RedisCoordinator::connect(&cluster.urls()).expect("connect")));
}
