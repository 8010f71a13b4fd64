//! The two end-to-end scenarios of the Coordinator (see
//! coordinator_scenarios.rs for etcd) on Redis, standalone and a 3-master
//! cluster: two coordinator instances with their own connections stand in
//! for two containers.
//!
//! * KV invalidation: B mirrors a bucket A writes, through `kv_watch`.
//! * LiveMetricsFanout: a producer appends while consumers from the end and
//!   from the start read every entry, in order, exactly once.

use fleetcoord::coordinator::{Coordinator, KvEvent, RedisCoordinator, StreamPosition};
use fleetcoord::testing::{RedisCluster, RedisServer};
use std::time::Duration;

// Delivery takes milliseconds; the bound only guards against a hang on a
// loaded CI machine.
const WAIT: Duration = Duration::from_secs(10);

fn container(urls: &str) -> RedisCoordinator {
    RedisCoordinator::connect(urls).expect("connect")
}

fn kv_invalidation(urls: &str) {
    let a = container(urls);
    let b = container(urls);
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

fn live_metrics_fanout(urls: &str) {
    let producer = container(urls);
    let consumer = container(urls);
    for i in 0..5u32 {
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
        (0..300u32)
            .map(|i| {
                producer
                    .append_stream("metrics", format!("late-{i}").as_bytes())
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    let ids = producer_thread.join().unwrap();
    let expected_late: Vec<Vec<u8>> = (0..300u32)
        .map(|i| format!("late-{i}").into_bytes())
        .collect();
    assert_eq!(ids.first().map(|id| id.0), Some(6));
    assert_eq!(ids.last().map(|id| id.0), Some(305));

    let end: Vec<_> = (0..300)
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

    for expected_id in 1..=305u64 {
        let e = from_start
            .recv_timeout(WAIT)
            .expect("entry from Start reader");
        assert_eq!(e.id.0, expected_id);
        if expected_id > 5 {
            assert_eq!(e.payload, expected_late[(expected_id - 6) as usize]);
        }
    }
    assert!(from_start.recv_timeout(Duration::from_millis(200)).is_err());
    assert!(from_end.recv_timeout(Duration::from_millis(200)).is_err());
}

#[test]
fn standalone_scenarios() {
    let server = RedisServer::start().expect("start redis-server (run `make deps-redis`)");
    kv_invalidation(&server.url());
    live_metrics_fanout(&server.url());
}

#[test]
fn cluster_scenarios() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster (run `make deps-redis`)");
    kv_invalidation(&cluster.urls());
    live_metrics_fanout(&cluster.urls());
}
