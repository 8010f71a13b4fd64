//! The two end-to-end scenarios of the Coordinator on a real nats-server
//! (the etcd versions are in coordinator_scenarios.rs): two coordinator
//! instances with their own connections and driver threads stand in for
//! two containers.

use fleetcoord::coordinator::{Coordinator, KvEvent, NatsCoordinator, StreamPosition};
use fleetcoord::testing::NatsServer;
use std::time::Duration;

// Delivery takes milliseconds; the bound only guards against a hang on a
// loaded CI machine.
const WAIT: Duration = Duration::from_secs(10);

fn container(server: &NatsServer) -> NatsCoordinator {
    NatsCoordinator::connect(&server.url()).expect("connect")
}

#[test]
fn flow_publish_invalidation_b_sees_a_kv_set_through_kv_watch() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats` installs it)");
    let a = container(&server);
    let b = container(&server);
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
    a.kv_delete("fleet", "leader").unwrap();
    assert_eq!(
        watch.recv_timeout(WAIT).unwrap(),
        KvEvent::Deleted {
            key: "leader".into()
        }
    );
    assert_eq!(b.kv_get("fleet", "existing").unwrap(), b"1".to_vec());
}

#[test]
fn stream_fan_out_consumers_from_end_and_start_read_every_entry_in_order() {
    let server = NatsServer::start().expect("start nats-server (`make deps-nats` installs it)");
    let producer = container(&server);
    let consumer = container(&server);
    // Entries before the consumers start: only the Start reader sees them.
    for i in 0..5u32 {
        producer
            .append_stream("jobs", format!("early-{i}").as_bytes())
            .unwrap();
    }
    let from_end = consumer.read_stream("jobs", StreamPosition::End).unwrap();
    let from_start = consumer.read_stream("jobs", StreamPosition::Start).unwrap();
    let producer_thread = std::thread::spawn(move || {
        (0..200u32)
            .map(|i| {
                producer
                    .append_stream("jobs", format!("late-{i}").as_bytes())
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    let ids = producer_thread.join().unwrap();
    let expected_late: Vec<Vec<u8>> = (0..200u32)
        .map(|i| format!("late-{i}").into_bytes())
        .collect();

    let mut end_payloads = Vec::new();
    let mut last = 0;
    for _ in 0..200 {
        let e = from_end.recv_timeout(WAIT).expect("entry from End reader");
        assert!(e.id.0 > last, "ids increase");
        last = e.id.0;
        end_payloads.push(e.payload);
    }
    assert_eq!(end_payloads, expected_late);
    assert_eq!(last, ids.last().unwrap().0);

    let mut start_payloads = Vec::new();
    for expected_id in 1..=205u64 {
        let e = from_start
            .recv_timeout(WAIT)
            .expect("entry from Start reader");
        assert_eq!(e.id.0, expected_id);
        start_payloads.push(e.payload);
    }
    assert_eq!(&start_payloads[5..], expected_late.as_slice());
    assert_eq!(start_payloads[0], b"early-0".to_vec());
    // Nothing extra afterwards.
    assert!(from_start.recv_timeout(Duration::from_millis(200)).is_err());
}
