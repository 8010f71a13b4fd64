//! KV compare-and-set and per-key TTL: racing writers (exactly one wins,
//! the loser learns the winner's revision), create-if-absent, expiry seen
//! by `kv_get` and by watchers, a plain set removing the expiry, input
//! refused alike everywhere, and many threads incrementing one key.
//!
//! A backend (or server version) that answers a call here with an error of
//! kind [`ErrorKind::Unsupported`] is reported as unsupported with its
//! reason, never skipped silently; the case then still checks that the
//! refusal wrote nothing.

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{expect_not_found, expect_snapshot, ok, put, recv};
use crate::coordinator::{Coordinator, KvEvent, KvSetOptions, MAX_KV_TTL, MIN_KV_TTL};
use crate::error::{Error, ErrorKind, Result};
use crossbeam_channel::RecvTimeoutError;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[
    Case {
        name: "kv_set_if bad input is InvalidArgument with the allowed range",
        needs: Needs::Nothing,
        run: bad_input,
    },
    Case {
        name: "kv_set_if with a revision of another key is InvalidArgument",
        needs: Needs::Delivery,
        run: revision_of_another_key,
    },
    Case {
        name: "kv_set_if two writers racing on one revision: exactly one wins",
        needs: Needs::Delivery,
        run: race_on_revision,
    },
    Case {
        name: "kv_set_if create-if-absent racing: exactly one wins",
        needs: Needs::Delivery,
        run: race_on_absent,
    },
    Case {
        name: "kv TTL expiry seen by kv_get and by a watcher",
        needs: Needs::Delivery,
        run: ttl_expires,
    },
    Case {
        name: "kv TTL removed by a plain set",
        needs: Needs::Delivery,
        run: ttl_removed_by_set,
    },
    Case {
        name: "kv_set_if 8 threads incrementing one key end exactly at the total",
        needs: Needs::Delivery,
        run: increments,
    },
];

/// The TTL the expiry cases use: the shortest every backend accepts.
const TTL: Duration = MIN_KV_TTL;

/// How late after its TTL a key's expiry may be heard (the contract's
/// second), plus the delivery slack every asynchronous case allows.
const EXPIRY_SLACK: Duration = Duration::from_secs(1);

/// How many increments each of the 8 threads of [`increments`] makes:
/// `FLEETCOORD_CAS_INCREMENTS` when set to 1 ..= 1,000,000 (the issue's
/// full size is 1000), else 100, which keeps a run of the whole suite
/// short.
fn increments_per_thread() -> u64 {
    std::env::var("FLEETCOORD_CAS_INCREMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (1..=1_000_000).contains(n))
        .unwrap_or(100)
}

/// `result`, or `None` after reporting the case unsupported when the
/// backend says it does not offer the call.
fn supported<T>(ctx: &Ctx<'_>, result: Result<T>, call: &str) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            ctx.unsupported(format!("{call}: {e}"));
            None
        }
        Err(e) => panic!("{call}: {e}"),
    }
}

/// Whether the backend offers revisions (`kv_get_entry` of a key that is
/// not set answers `NotFound`), reporting the case unsupported if not.
fn offers_revisions(ctx: &Ctx<'_>, c: &dyn Coordinator, bucket: &str) -> bool {
    match c.kv_get_entry(bucket, "never-set") {
        Err(Error::NotFound) => true,
        other => supported(ctx, other.map(|_| ()), "kv_get_entry").is_some(),
    }
}

fn expect_invalid_naming(result: Result<u64>, field: &str, words: &[&str], call: &str) {
    match result {
        Err(Error::InvalidArgument { what, why }) if what == field => {
            for word in words {
                assert!(
                    why.contains(word),
                    "{call}: the refusal {why:?} should say {word:?}"
                );
            }
        }
        other => panic!("{call}: expected InvalidArgument naming {field:?}, got {other:?}"),
    }
}

fn expect_conflict<T: std::fmt::Debug>(result: &Result<T>, current: Option<u64>, call: &str) {
    match result {
        Err(Error::Conflict { current: c, .. }) if *c == current => {}
        other => panic!("{call}: expected Error::Conflict with current {current:?}, got {other:?}"),
    }
}

fn bad_input(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let bucket = unique("cas-input");
    let range = [
        "allowed range",
        &format!("{} s", MIN_KV_TTL.as_secs()),
        &format!("{} s", MAX_KV_TTL.as_secs()),
    ]
    .map(str::to_owned);
    let range: Vec<&str> = range.iter().map(String::as_str).collect();
    for (ttl, what) in [
        (Duration::ZERO, "a TTL of 0"),
        (
            MIN_KV_TTL - Duration::from_millis(1),
            "a TTL below the minimum",
        ),
        (
            MAX_KV_TTL + Duration::from_secs(1),
            "a TTL above the maximum",
        ),
        (Duration::MAX, "the largest Duration"),
    ] {
        let result = c.kv_set_with_ttl(&bucket, "k", b"v", ttl);
        if let Err(e) = &result {
            if e.kind() == ErrorKind::Unsupported {
                ctx.unsupported(format!("kv_set_with_ttl: {e}"));
                return;
            }
        }
        expect_invalid_naming(result, "ttl", &range, what);
        // With a condition too: the input is checked before anything.
        let options = KvSetOptions::new().if_absent().with_ttl(ttl);
        expect_invalid_naming(
            c.kv_set_with(&bucket, "k", b"v", options),
            "ttl",
            &range,
            what,
        );
    }
    expect_not_found(c.kv_get(&bucket, "k"), "kv_get after refused writes");
    // The other arguments are checked as kv_set checks them.
    match c.kv_set_if(&bucket, "", b"v", 0) {
        Err(Error::InvalidArgument { what: "key", .. }) => {}
        other => panic!("kv_set_if with an empty key: expected InvalidArgument, got {other:?}"),
    }
}

fn revision_of_another_key(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let bucket = unique("cas-other");
    let Some(mine) = supported(ctx, c.kv_set_if(&bucket, "mine", b"1", 0), "kv_set_if") else {
        return;
    };
    let other = ok(c.kv_set_if(&bucket, "other", b"1", 0), "kv_set_if");
    assert!(
        other > mine,
        "a later write in a bucket has a larger revision: {mine} then {other}"
    );
    expect_invalid_naming(
        c.kv_set_if(&bucket, "mine", b"2", other),
        "expected_revision",
        &["allowed range", &mine.to_string()],
        "kv_set_if with the other key's newer revision",
    );
    let entry = ok(c.kv_get_entry(&bucket, "mine"), "kv_get_entry");
    assert_eq!(
        (entry.value.as_slice(), entry.revision),
        (&b"1"[..], mine),
        "a refused write changed the key"
    );
}

/// Runs `writers` on their own handles, released together; returns each
/// one's result in order.
fn race<T: Send + 'static>(
    ctx: &Ctx<'_>,
    writers: usize,
    write: impl Fn(usize, &dyn Coordinator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let handles: Vec<_> = (0..writers).map(|_| ctx.open()).collect();
    let barrier = Arc::new(Barrier::new(writers));
    let write = Arc::new(write);
    let threads: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let (barrier, write) = (barrier.clone(), write.clone());
            std::thread::spawn(move || {
                barrier.wait();
                write(i, &*c)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a racing writer panicked"))
        .collect()
}

fn race_on_revision(ctx: &Ctx<'_>) {
    let (c, w) = (ctx.open(), ctx.open());
    let bucket = unique("cas-race");
    let Some(mut revision) = supported(ctx, c.kv_set_if(&bucket, "k", b"start", 0), "kv_set_if")
    else {
        return;
    };
    let watch = ok(w.kv_watch(&bucket, "*"), "kv_watch");
    expect_snapshot(&watch, &[("k", b"start")], "snapshot");
    for round in 0..5 {
        let entry = ok(c.kv_get_entry(&bucket, "k"), "kv_get_entry");
        assert_eq!(entry.revision, revision, "round {round}: kv_get_entry");
        let b = bucket.clone();
        let results = race(ctx, 2, move |i, c| {
            c.kv_set_if(&b, "k", format!("writer {i}").as_bytes(), revision)
        });
        let wins: Vec<(usize, u64)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().ok().map(|rev| (i, *rev)))
            .collect();
        let [(winner, won)] = wins.as_slice() else {
            panic!("round {round}: exactly one of two writers must win: {results:?}");
        };
        assert!(
            *won > revision,
            "round {round}: the new revision {won} must grow"
        );
        let loser = 1 - winner;
        expect_conflict(
            &results[loser],
            Some(*won),
            &format!("round {round}: the loser"),
        );
        let value = format!("writer {winner}");
        let entry = ok(c.kv_get_entry(&bucket, "k"), "kv_get_entry");
        assert_eq!(
            (entry.value.as_slice(), entry.revision),
            (value.as_bytes(), *won),
            "round {round}: the key holds the winner's write"
        );
        assert_eq!(
            recv(&watch, "the winning write"),
            put("k", value.as_bytes()),
            "round {round}: watchers see a conditional write as a put"
        );
        revision = *won;
    }
    // A stale revision after a delete: the key is absent.
    ok(c.kv_delete(&bucket, "k"), "kv_delete");
    expect_conflict(
        &c.kv_set_if(&bucket, "k", b"late", revision),
        None,
        "kv_set_if of a deleted key",
    );
    assert_eq!(
        recv(&watch, "the delete"),
        KvEvent::Deleted { key: "k".into() }
    );
    expect_not_found(c.kv_get_entry(&bucket, "k"), "kv_get_entry after delete");
}

fn race_on_absent(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let bucket = unique("cas-absent");
    if !offers_revisions(ctx, &*c, &bucket) {
        return;
    }
    for round in 0..3 {
        let key = format!("claim-{round}");
        let (b, k) = (bucket.clone(), key.clone());
        let results = race(ctx, 4, move |i, c| {
            c.kv_set_if(&b, &k, format!("owner {i}").as_bytes(), 0)
        });
        if let Some(Err(e)) = results.first() {
            if e.kind() == ErrorKind::Unsupported {
                ctx.unsupported(format!("kv_set_if: {e}"));
                return;
            }
        }
        let wins: Vec<(usize, u64)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().ok().map(|rev| (i, *rev)))
            .collect();
        let [(winner, won)] = wins.as_slice() else {
            panic!("round {round}: exactly one of 4 claims must win: {results:?}");
        };
        for (i, r) in results.iter().enumerate() {
            if i != *winner {
                expect_conflict(r, Some(*won), &format!("round {round}: claim {i}"));
            }
        }
        let entry = ok(c.kv_get_entry(&bucket, &key), "kv_get_entry");
        assert_eq!(
            (entry.value, entry.revision),
            (format!("owner {winner}").into_bytes(), *won)
        );
        // Released, the claim can be taken again.
        ok(c.kv_delete(&bucket, &key), "kv_delete");
        ok(
            c.kv_set_if(&bucket, &key, b"again", 0),
            "a claim after delete",
        );
    }
}

/// Waits for `key`'s delete on `watch` until `deadline`.
fn expect_expiry(watch: &crate::coordinator::KvWatcher, key: &str, deadline: Instant, what: &str) {
    let left = deadline.saturating_duration_since(Instant::now());
    match watch.recv_timeout(left) {
        Ok(KvEvent::Deleted { key: k }) if k == key => {}
        Ok(other) => panic!("{what}: expected the expiry of {key:?}, got {other:?}"),
        Err(RecvTimeoutError::Timeout) => {
            panic!("{what}: no delete of {key:?} within the TTL and a second")
        }
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: the feed ended"),
    }
}

fn ttl_expires(ctx: &Ctx<'_>) {
    let (c, w) = (ctx.open(), ctx.open());
    let bucket = unique("ttl");
    let watch = ok(w.kv_watch(&bucket, "*"), "kv_watch");
    assert_eq!(recv(&watch, "empty bucket"), KvEvent::Synced);
    let began = Instant::now();
    let Some(revision) = supported(
        ctx,
        c.kv_set_with_ttl(&bucket, "presence", b"here", TTL),
        "kv_set_with_ttl",
    ) else {
        // Refused at once, and nothing was written.
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "an unsupported TTL must fail at once, took {:?}",
            began.elapsed()
        );
        expect_not_found(c.kv_get(&bucket, "presence"), "kv_get after a refused TTL");
        return;
    };
    let entry = ok(c.kv_get_entry(&bucket, "presence"), "kv_get_entry");
    assert_eq!(
        (entry.value.as_slice(), entry.revision),
        (&b"here"[..], revision)
    );
    assert_eq!(recv(&watch, "the set"), put("presence", b"here"));
    // A claim with a TTL: create-if-absent loses while the key lives.
    expect_conflict(
        &c.kv_set_with(
            &bucket,
            "presence",
            b"other",
            KvSetOptions::new().if_absent().with_ttl(TTL),
        ),
        Some(revision),
        "a claim on a live key",
    );
    let deadline = began + TTL + EXPIRY_SLACK;
    expect_expiry(&watch, "presence", deadline, "the watcher");
    assert!(
        began.elapsed() >= TTL - Duration::from_millis(50),
        "the key expired early, after {:?}",
        began.elapsed()
    );
    expect_not_found(c.kv_get(&bucket, "presence"), "kv_get after the TTL");
    expect_not_found(
        c.kv_get_entry(&bucket, "presence"),
        "kv_get_entry after the TTL",
    );
    // Expired is absent: a claim wins again.
    ok(
        c.kv_set_if(&bucket, "presence", b"back", 0),
        "a claim after expiry",
    );
}

fn ttl_removed_by_set(ctx: &Ctx<'_>) {
    let (c, w) = (ctx.open(), ctx.open());
    let bucket = unique("ttl-set");
    let watch = ok(w.kv_watch(&bucket, "*"), "kv_watch");
    assert_eq!(recv(&watch, "empty bucket"), KvEvent::Synced);
    let began = Instant::now();
    if supported(
        ctx,
        c.kv_set_with_ttl(&bucket, "k", b"brief", TTL),
        "kv_set_with_ttl",
    )
    .is_none()
    {
        expect_not_found(c.kv_get(&bucket, "k"), "kv_get after a refused TTL");
        return;
    }
    // A key whose TTL is renewed by another TTL write lives on too.
    let _ = ok(
        c.kv_set_with_ttl(&bucket, "renewed", b"1", TTL),
        "kv_set_with_ttl",
    );
    ok(c.kv_set(&bucket, "k", b"kept"), "kv_set");
    assert_eq!(recv(&watch, "the TTL set"), put("k", b"brief"));
    assert_eq!(recv(&watch, "the other TTL set"), put("renewed", b"1"));
    assert_eq!(recv(&watch, "the plain set"), put("k", b"kept"));
    std::thread::sleep(TTL * 3 / 4);
    let _ = ok(
        c.kv_set_with_ttl(&bucket, "renewed", b"2", TTL),
        "kv_set_with_ttl again",
    );
    assert_eq!(recv(&watch, "the renewal"), put("renewed", b"2"));
    let quiet_until = began + TTL + EXPIRY_SLACK;
    // Nothing may arrive for "k"; "renewed" expires a TTL after its
    // renewal, which is later than that.
    let left = quiet_until.saturating_duration_since(Instant::now());
    match watch.recv_timeout(left) {
        Err(RecvTimeoutError::Timeout) => {}
        other => panic!("a plain set must remove the expiry: unexpected {other:?}"),
    }
    assert_eq!(ok(c.kv_get(&bucket, "k"), "kv_get after the TTL"), b"kept");
    assert_eq!(
        ok(c.kv_get(&bucket, "renewed"), "kv_get of the renewed key"),
        b"2"
    );
}

fn increments(ctx: &Ctx<'_>) {
    const THREADS: usize = 8;
    let per_thread = increments_per_thread();
    let c = ctx.open();
    let bucket = unique("cas-count");
    if !offers_revisions(ctx, &*c, &bucket) {
        return;
    }
    let began = Instant::now();
    let b = bucket.clone();
    let counts = race(ctx, THREADS, move |_, c| {
        let (mut wins, mut conflicts) = (0u64, 0u64);
        while wins < per_thread {
            let (n, expected) = match c.kv_get_entry(&b, "n") {
                Ok(entry) => {
                    let text = String::from_utf8(entry.value).expect("a decimal count");
                    (
                        text.parse::<u64>().expect("a decimal count"),
                        entry.revision,
                    )
                }
                Err(Error::NotFound) => (0, 0),
                Err(e) => panic!("kv_get_entry: {e}"),
            };
            let next = n.checked_add(1).expect("a count below u64::MAX");
            match c.kv_set_if(&b, "n", next.to_string().as_bytes(), expected) {
                Ok(_) => wins += 1,
                Err(Error::Conflict { .. }) => conflicts += 1,
                Err(e) => panic!("kv_set_if: neither a win nor a conflict: {e}"),
            }
        }
        (wins, conflicts)
    });
    let wins: u64 = counts.iter().map(|(w, _)| w).sum();
    let conflicts: u64 = counts.iter().map(|(_, c)| c).sum();
    let total = per_thread * THREADS as u64;
    let end = ok(c.kv_get(&bucket, "n"), "kv_get of the count");
    assert_eq!(
        String::from_utf8_lossy(&end),
        total.to_string(),
        "{THREADS} threads x {per_thread} increments ({wins} wins, {conflicts} conflicts)"
    );
    assert_eq!(wins, total, "every win is one increment");
    ctx.note(format!(
        "{THREADS} threads x {per_thread} increments: {total} wins + {conflicts} conflicts \
         = {} attempts, in {:?}",
        wins + conflicts,
        began.elapsed()
    ));
}
