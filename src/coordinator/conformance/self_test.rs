//! The suite's own tests: backends with one deliberate bug each must fail
//! the case written to catch it, and a correct backend must pass, so a
//! green conformance run means something.

use super::{cases, panic_text, run_selected};
use crate::coordinator::{
    Coordinator, KvEntry, KvSetOptions, KvWatcher, MemoryCoordinator, StreamId, StreamPosition,
    StreamReader, Subscription,
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
    /// Every 7th append is stored and reported as a retryable failure.
    FailedButStored,
    /// Every 7th append is stored twice and reported once.
    StoredTwice,
    /// `kv_set_with` ignores its expected revision: every writer wins.
    CasAlwaysWins,
    /// `kv_set_with` ignores its TTL: keys never expire.
    TtlIgnored,
    /// A refused conditional write reports the revision the caller
    /// expected, not the winner's.
    ConflictNamesExpected,
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
        let id = self.0.append_stream(stream, payload)?;
        match self.1 {
            Bug::FailedButStored if id.0 % 7 == 0 => Err(crate::Error::etcd(
                crate::ErrorKind::Unavailable,
                "the answer was lost",
            )),
            Bug::StoredTwice if id.0 % 7 == 0 => {
                self.0.append_stream(stream, payload)?;
                Ok(id)
            }
            _ => Ok(id),
        }
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
    fn kv_get_entry(&self, bucket: &str, key: &str) -> Result<KvEntry> {
        self.0.kv_get_entry(bucket, key)
    }
    fn kv_set_with(
        &self,
        bucket: &str,
        key: &str,
        value: &[u8],
        options: KvSetOptions,
    ) -> Result<u64> {
        let mut plain = KvSetOptions::new();
        if let Some(ttl) = options.ttl() {
            plain = plain.with_ttl(ttl);
        }
        match self.1 {
            Bug::CasAlwaysWins => self.0.kv_set_with(bucket, key, value, plain),
            Bug::TtlIgnored => {
                let mut kept = KvSetOptions::new();
                if let Some(expected) = options.expected_revision() {
                    kept = kept.if_revision(expected);
                }
                self.0.kv_set_with(bucket, key, value, kept)
            }
            Bug::ConflictNamesExpected => match self.0.kv_set_with(bucket, key, value, options) {
                Err(crate::Error::Conflict { bucket, key, .. }) => Err(crate::Error::Conflict {
                    bucket,
                    key,
                    current: options.expected_revision(),
                }),
                other => other,
            },
            _ => self.0.kv_set_with(bucket, key, value, options),
        }
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
        run_selected(
            &|| Box::new(Buggy(hub.clone(), bug)),
            None,
            None,
            cases(),
            |name| name == case,
        )
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
    let restart = "stream appends across a restart are stored exactly once";
    assert!(fails(Bug::FailedButStored, restart).contains("stores it twice"));
    assert!(fails(Bug::StoredTwice, restart).contains("the stream holds it at"));
    let race = "kv_set_if two writers racing on one revision: exactly one wins";
    assert!(fails(Bug::CasAlwaysWins, race).contains("exactly one of two writers must win"));
    let absent = "kv_set_if create-if-absent racing: exactly one wins";
    assert!(fails(Bug::CasAlwaysWins, absent).contains("exactly one of 4 claims must win"));
    // Not the increments case: threads that happen not to overlap (a
    // loaded machine runs them one after another) end at the total even
    // on this bug; the barrier-released races above always overlap.
    assert!(fails(Bug::ConflictNamesExpected, race).contains("expected Error::Conflict"));
    let expiry = "kv TTL expiry seen by kv_get and by a watcher";
    assert!(fails(Bug::TtlIgnored, expiry).contains("within the TTL and a second"));
}

#[test]
fn a_backend_without_revisions_is_reported_unsupported_not_passed() {
    // A backend written before revisions existed keeps the trait's
    // defaults, which answer Unsupported: reported, never passed.
    struct Bare(MemoryCoordinator);
    impl Coordinator for Bare {
        fn publish(&self, t: &str, p: &[u8]) -> Result<()> {
            self.0.publish(t, p)
        }
        fn subscribe(&self, t: &str) -> Result<Subscription> {
            self.0.subscribe(t)
        }
        fn append_stream(&self, s: &str, p: &[u8]) -> Result<StreamId> {
            self.0.append_stream(s, p)
        }
        fn read_stream(&self, s: &str, f: StreamPosition) -> Result<StreamReader> {
            self.0.read_stream(s, f)
        }
        fn kv_set(&self, b: &str, k: &str, v: &[u8]) -> Result<()> {
            self.0.kv_set(b, k, v)
        }
        fn kv_get(&self, b: &str, k: &str) -> Result<Vec<u8>> {
            self.0.kv_get(b, k)
        }
        fn kv_delete(&self, b: &str, k: &str) -> Result<()> {
            self.0.kv_delete(b, k)
        }
        fn kv_watch(&self, b: &str, p: &str) -> Result<KvWatcher> {
            self.0.kv_watch(b, p)
        }
        fn ping(&self) -> Result<()> {
            self.0.ping()
        }
        fn close(&self) -> Result<()> {
            self.0.close()
        }
    }
    let hub = MemoryCoordinator::new();
    let report = run_selected(
        &|| Box::new(Bare(hub.clone())),
        None,
        None,
        cases(),
        |name| name.starts_with("kv_set_if") || name.starts_with("kv TTL"),
    );
    assert!(report.passed.is_empty(), "{:?}", report.passed);
    assert_eq!(report.unsupported.len(), 7, "{:?}", report.unsupported);
    assert!(report
        .unsupported
        .iter()
        .all(|(_, why)| why.contains("not supported by this backend")));
}

#[test]
fn the_restart_hook_runs_while_appends_are_running() {
    let hub = MemoryCoordinator::new();
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let restart = || {
        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    };
    let report = run_selected(
        &|| Box::new(hub.clone()),
        Some(&restart),
        None,
        cases(),
        |name| name.contains("restart"),
    );
    assert_eq!(report.passed.len(), 1);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    // A failing hook fails the case, naming it.
    let broken = || Err(crate::Error::invalid("restart", "cannot"));
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        run_selected(
            &|| Box::new(hub.clone()),
            Some(&broken),
            None,
            cases(),
            |name| name.contains("restart"),
        )
    }));
    let text = outcome.map_or_else(|p| panic_text(&*p), |r| format!("passed: {r:?}"));
    assert!(text.contains("the restart hook failed"), "{text}");
}

#[test]
fn a_correct_backend_passes_selected_cases() {
    let hub = MemoryCoordinator::new();
    let report = run_selected(&|| Box::new(hub.clone()), None, None, cases(), |name| {
        name.starts_with("kv")
    });
    assert_eq!(
        report.passed.len(),
        cases().filter(|c| c.name.starts_with("kv")).count()
    );
}
