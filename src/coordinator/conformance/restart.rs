//! Appends across a server restart: two threads append, retrying every
//! retryable error as a careful caller would, while the backend's server is
//! restarted (when the factory came with a restart hook, see
//! [`run_with_restart`](super::run_with_restart)). Then the whole stream is
//! read back: every `Ok(id)` is stored exactly once, at `id`; every append
//! that failed with a retryable error is absent; an
//! [`Error::Indeterminate`] one is stored at most once, at its `id` if it
//! names one. Without a hook the same appends and checks run without the
//! restart.

use super::case::{unique, Case, Ctx, Needs};
use super::expect::ok;
use super::QUIET;
use crate::coordinator::{Coordinator, StreamId, StreamPosition};
use crate::error::Error;
use crossbeam_channel::RecvTimeoutError;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[Case {
    name: "stream appends across a restart are stored exactly once",
    needs: Needs::Delivery,
    run: appends_across_restarts,
}];

const THREADS: usize = 2;

/// Restarts, spread evenly over the appends.
const RESTARTS: usize = 3;

/// Appends per thread on a stream that keeps everything.
const APPENDS: usize = 100;

/// How long one thread may take for all its appends, restarts and retries
/// included.
const PATIENCE: Duration = Duration::from_secs(180);

/// Liveness: how long one `append_stream` call may take, restart or not.
/// Every backend's default request timeout is 5 s; this is that plus room
/// for a reconnect, and turns a hang into a failure.
const CALL_BOUND: Duration = Duration::from_secs(15);

/// Liveness: how long one item may take to settle (Ok or Indeterminate)
/// from its first attempt, retries after a restart included.
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// Pause between a retryable failure and the caller's next try.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// How long reading the stream back may wait for one entry.
const READ_WAIT: Duration = Duration::from_secs(30);

/// How one call of `append_stream` ended.
#[derive(Debug)]
enum Outcome {
    Stored(StreamId),
    /// Retryable: must not be stored.
    Failed(String),
    /// May be stored, once, at the ID if one is named.
    Unknown(Option<StreamId>),
}

fn appends_across_restarts(ctx: &Ctx<'_>) {
    // Every entry must still be there to be checked: with trimming, stay
    // well within the maximum length (Indeterminate appends may add some).
    let per_thread = match ctx.caps.stream_max_len {
        Some(max) => usize::try_from(max / 4).map_or(APPENDS, |n| n.clamp(1, APPENDS)),
        None => APPENDS,
    };
    let stream = unique("restart");
    let handles: Vec<_> = (0..THREADS).map(|_| ctx.open()).collect();
    let settled = AtomicUsize::new(0);
    let began = Instant::now();
    let mut restarted = Vec::new();
    let mut restart_error = None;
    let calls: Vec<Vec<(Vec<u8>, Outcome)>> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(t, c)| {
                let (stream, settled) = (&stream, &settled);
                s.spawn(move || append_all(t, c.as_ref(), stream, per_thread, settled))
            })
            .collect();
        if let Some(restart) = ctx.restart {
            let total = THREADS * per_thread;
            for k in 1..=RESTARTS {
                // Restart while appends are running, not between them.
                let at = total * k / (RESTARTS + 1);
                while settled.load(Ordering::SeqCst) < at && !joins.iter().all(|j| j.is_finished())
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let t = Instant::now();
                if let Err(e) = restart() {
                    restart_error = Some(e);
                    break;
                }
                restarted.push(t.elapsed());
            }
        }
        joins
            .into_iter()
            .map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    if let Some(e) = restart_error {
        panic!("the restart hook failed: {e}");
    }
    let appended = began.elapsed();
    let stored = read_back(ctx, &stream);
    let (mut ok, mut failed, mut unknown) = (0, 0, 0);
    let mut claimed: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for (payload, outcome) in calls.iter().flatten() {
        let what = String::from_utf8_lossy(payload);
        let at: Vec<StreamId> = stored
            .iter()
            .filter(|(_, p)| p == payload)
            .map(|(id, _)| *id)
            .collect();
        *claimed.entry(payload.clone()).or_default() += 1;
        match outcome {
            Outcome::Stored(id) => {
                ok += 1;
                assert_eq!(
                    at,
                    [*id],
                    "append {what:?} returned Ok({id}); the stream holds it at {at:?}"
                );
            }
            Outcome::Failed(e) => {
                failed += 1;
                assert!(
                    at.is_empty(),
                    "append {what:?} failed with a retryable error ({e}), yet the stream \
                     holds it at {at:?}: a caller retrying it stores it twice"
                );
            }
            Outcome::Unknown(id) => {
                unknown += 1;
                assert!(
                    at.len() <= 1,
                    "append {what:?} (Indeterminate) stored at {at:?}"
                );
                if let (Some(id), Some(found)) = (id, at.first()) {
                    assert_eq!(id, found, "append {what:?}: Indeterminate named {id}");
                }
            }
        }
    }
    for (id, payload) in &stored {
        assert!(
            claimed.contains_key(payload),
            "entry {id} ({:?}) was never appended",
            String::from_utf8_lossy(payload)
        );
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "restart case: {ok} appends ok, {failed} retryable failures (none stored), {unknown} \
         indeterminate, {} entries read back; restarts took {restarted:?}; appends took \
         {appended:?}",
        stored.len()
    );
}

/// Thread `t` appends `n` distinct items, retrying each after every
/// retryable error under a new payload, so that where each attempt ended
/// up can be told apart.
fn append_all(
    t: usize,
    c: &dyn Coordinator,
    stream: &str,
    n: usize,
    settled: &AtomicUsize,
) -> Vec<(Vec<u8>, Outcome)> {
    let deadline = Instant::now() + PATIENCE;
    let mut calls = Vec::new();
    for i in 0..n {
        let first = Instant::now();
        for attempt in 0u32.. {
            let payload = format!("{t}:{i}:{attempt}").into_bytes();
            let called = Instant::now();
            let result = c.append_stream(stream, &payload);
            let took = called.elapsed();
            assert!(
                took <= CALL_BOUND,
                "thread {t}, append {i}: one call took {took:?} (bound {CALL_BOUND:?})"
            );
            let outcome = match result {
                Ok(id) => Outcome::Stored(id),
                Err(Error::Indeterminate { id, .. }) => Outcome::Unknown(id),
                Err(e) if e.is_retryable() => Outcome::Failed(e.to_string()),
                Err(e) => {
                    panic!("thread {t}, append {i}: {e} is neither Ok, retryable nor Indeterminate")
                }
            };
            let done = !matches!(outcome, Outcome::Failed(_));
            calls.push((payload, outcome));
            assert!(
                done || first.elapsed() < SETTLE_BOUND,
                "thread {t}, append {i}: not settled {SETTLE_BOUND:?} after its first try: {:?}",
                calls.last().map(|(_, o)| o)
            );
            if done {
                settled.fetch_add(1, Ordering::SeqCst);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "thread {t}, append {i}: still failing after {PATIENCE:?}: {:?}",
                calls.last().map(|(_, o)| o)
            );
            std::thread::sleep(RETRY_PAUSE);
        }
    }
    calls
}

/// Every entry of `stream`, read from the start by a new handle, in order.
fn read_back(ctx: &Ctx<'_>, stream: &str) -> Vec<(StreamId, Vec<u8>)> {
    let reader = ok(
        ctx.open().read_stream(stream, StreamPosition::Start),
        "read_stream(Start) after the appends",
    );
    let mut entries: Vec<(StreamId, Vec<u8>)> = Vec::new();
    // Live readers never end: the stream is read once nothing more comes.
    let mut wait = READ_WAIT;
    loop {
        match reader.recv_timeout(wait) {
            Ok(e) => {
                if let Some((last, _)) = entries.last() {
                    assert!(e.id > *last, "read back {} after {last}", e.id);
                }
                entries.push((e.id, e.payload));
                wait = QUIET.max(Duration::from_millis(500));
            }
            Err(RecvTimeoutError::Timeout) if !entries.is_empty() => return entries,
            Err(RecvTimeoutError::Timeout) => panic!("reading back: nothing within {wait:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("reading back: the reader ended"),
        }
    }
}
