//! The suite's own tests: backends with one deliberate bug each must fail
//! the case written to catch it, and a correct backend must pass, so a
//! green conformance run means something.

use super::{cases, panic_text, run_selected};
use crate::coordinator::{
    Coordinator, KvWatcher, MemoryCoordinator, StreamId, StreamPosition, StreamReader, Subscription,
};
use crate::error::Result;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A memory backend with one deliberate bug, to prove the suite notices.
#[derive(Clone, Copy)]
enum Bug {
    CloseDoesNothing,
    AfterSkipsOne,
    PatternIgnored,
    TopicIsPrefix,
}

struct Buggy(MemoryCoordinator, Bug);

impl Coordinator for Buggy {
    fn publish(&self, topic: &str, payload: &[u8]) -> Result<()> {
        self.0.publish(topic, payload)?;
        if let Bug::TopicIsPrefix = self.1 {
            // Also deliver to the topic one character shorter.
            self.0.publish(&topic[..topic.len() - 1], payload)?;
        }
        Ok(())
    }
    fn subscribe(&self, topic: &str) -> Result<Subscription> {
        self.0.subscribe(topic)
    }
    fn append_stream(&self, stream: &str, payload: &[u8]) -> Result<StreamId> {
        self.0.append_stream(stream, payload)
    }
    fn read_stream(&self, stream: &str, from: StreamPosition) -> Result<StreamReader> {
        let from = match (self.1, from) {
            (Bug::AfterSkipsOne, StreamPosition::After(id)) => {
                StreamPosition::After(StreamId(id.0 + 1))
            }
            (_, from) => from,
        };
        self.0.read_stream(stream, from)
    }
    fn kv_set(&self, bucket: &str, key: &str, value: &[u8]) -> Result<()> {
        self.0.kv_set(bucket, key, value)
    }
    fn kv_get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.0.kv_get(bucket, key)
    }
    fn kv_delete(&self, bucket: &str, key: &str) -> Result<()> {
        self.0.kv_delete(bucket, key)
    }
    fn kv_watch(&self, bucket: &str, pattern: &str) -> Result<KvWatcher> {
        match self.1 {
            Bug::PatternIgnored => self.0.kv_watch(bucket, "*"),
            _ => self.0.kv_watch(bucket, pattern),
        }
    }
    fn ping(&self) -> Result<()> {
        self.0.ping()
    }
    fn close(&self) -> Result<()> {
        match self.1 {
            Bug::CloseDoesNothing => Ok(()),
            _ => self.0.close(),
        }
    }
}

fn fails(bug: Bug, case: &str) -> String {
    let hub = MemoryCoordinator::new();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        run_selected(|| Box::new(Buggy(hub.clone(), bug)), |name| name == case)
    }));
    match outcome {
        Ok(report) => panic!("the suite missed a bug in {case:?}: {report:?}"),
        Err(panic) => panic_text(&*panic),
    }
}

#[test]
fn the_suite_catches_bugs() {
    assert!(fails(Bug::CloseDoesNothing, "Closed after close").contains("expected Error::Closed"));
    assert!(fails(Bug::CloseDoesNothing, "feeds end after close").contains("still open"));
    assert!(fails(Bug::AfterSkipsOne, "stream resume strictly after an id").contains("after id"));
    assert!(fails(Bug::PatternIgnored, "kv watch pattern isolation").contains("snapshot"));
    assert!(fails(Bug::TopicIsPrefix, "pub/sub exact topic").contains("the exact topic"));
}

#[test]
fn a_correct_backend_passes_selected_cases() {
    let hub = MemoryCoordinator::new();
    let report = run_selected(|| Box::new(hub.clone()), |name| name.starts_with("kv"));
    assert_eq!(
        report.passed.len(),
        cases().filter(|c| c.name.starts_with("kv")).count()
    );
}
