//! Stream cases: append and tail, replay from the start, resume strictly
//! after an id (also one trimmed away), and concurrent appenders getting
//! distinct, gap-free ids.

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{assert_quiet, entry, ok};
use crate::coordinator::{StreamId, StreamPosition};
use std::collections::{BTreeMap, BTreeSet};

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[
    Case {
        name: "stream append and tail",
        needs: Needs::Delivery,
        run: append_and_tail,
    },
    Case {
        name: "stream replay from start",
        needs: Needs::Delivery,
        run: replay_from_start,
    },
    Case {
        name: "stream resume strictly after an id",
        needs: Needs::Delivery,
        run: resume_after_id,
    },
    Case {
        name: "stream concurrent appenders",
        needs: Needs::Nothing,
        run: concurrent_appenders,
    },
    Case {
        name: "stream resume from a trimmed id",
        needs: Needs::Trimming,
        run: resume_from_trimmed_id,
    },
];

fn append_and_tail(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("tail");
    let reader = ok(
        b.read_stream(&stream, StreamPosition::End),
        "read_stream(End)",
    );
    let ids: Vec<StreamId> = (0..3u8)
        .map(|i| ok(a.append_stream(&stream, &[i]), "append"))
        .collect();
    assert_eq!(
        ids,
        [StreamId(1), StreamId(2), StreamId(3)],
        "a new stream numbers its entries from 1"
    );
    for (i, id) in ids.iter().enumerate() {
        entry(&reader, *id, &[i as u8], &format!("tailed entry {i}"));
    }
    assert_quiet(&reader, "tail");
}

fn replay_from_start(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("replay");
    let ids: Vec<StreamId> = (0..5u8)
        .map(|i| ok(a.append_stream(&stream, &[i]), "append"))
        .collect();
    let reader = ok(
        b.read_stream(&stream, StreamPosition::Start),
        "read_stream(Start)",
    );
    for (i, id) in ids.iter().enumerate() {
        entry(&reader, *id, &[i as u8], &format!("replayed entry {i}"));
    }
    let next = ok(a.append_stream(&stream, b"live"), "append");
    assert!(next > ids[4], "ids increase: {next} after {}", ids[4]);
    entry(&reader, next, b"live", "tailed after replay");
    assert_quiet(&reader, "after replay");
}

fn resume_after_id(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("resume");
    let ids: Vec<StreamId> = (0..5u8)
        .map(|i| ok(a.append_stream(&stream, &[i]), "append"))
        .collect();
    let reader = ok(
        b.read_stream(&stream, StreamPosition::After(ids[1])),
        "read_stream(After)",
    );
    let at_head = ok(
        b.read_stream(&stream, StreamPosition::After(ids[4])),
        "read_stream(After(head))",
    );
    let beyond = StreamId(ids[4].0 + 1000);
    let past_head = ok(
        b.read_stream(&stream, StreamPosition::After(beyond)),
        "read_stream(After(beyond head))",
    );
    for (i, id) in ids.iter().enumerate().skip(2) {
        entry(
            &reader,
            *id,
            &[i as u8],
            &format!("entry {i} after id {}", ids[1]),
        );
    }
    let next = ok(a.append_stream(&stream, b"next"), "append");
    entry(&reader, next, b"next", "tailed after resuming");
    entry(&at_head, next, b"next", "reader after the head id");
    entry(
        &past_head,
        next,
        b"next",
        "reader after an id beyond the head starts at the next append",
    );
    assert_quiet(&reader, "resumed reader");
}

fn concurrent_appenders(ctx: &Ctx<'_>) {
    const THREADS: usize = 4;
    const EACH: usize = 50;
    let stream = unique("concurrent");
    let handles: Vec<_> = (0..THREADS).map(|_| ctx.open()).collect();
    let per_thread: Vec<Vec<(StreamId, Vec<u8>)>> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(t, c)| {
                let stream = &stream;
                s.spawn(move || {
                    (0..EACH)
                        .map(|i| {
                            let payload = format!("{t}:{i}").into_bytes();
                            (
                                ok(c.append_stream(stream, &payload), "concurrent append"),
                                payload,
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all = BTreeMap::new();
    for (t, appended) in per_thread.iter().enumerate() {
        for pair in appended.windows(2) {
            assert!(
                pair[0].0 < pair[1].0,
                "thread {t}: id {} then {}",
                pair[0].0,
                pair[1].0
            );
        }
        for (id, payload) in appended {
            assert!(
                all.insert(*id, payload.clone()).is_none(),
                "id {id} handed out twice"
            );
        }
    }
    if !ctx.caps.delivers {
        return;
    }
    let expected: BTreeSet<StreamId> = (1..=(THREADS * EACH) as u64).map(StreamId).collect();
    assert_eq!(
        all.keys().copied().collect::<BTreeSet<_>>(),
        expected,
        "ids are 1..={}",
        THREADS * EACH
    );
    // A trimming backend replays only the newest entries it keeps.
    let kept = ctx
        .caps
        .stream_max_len
        .map_or(all.len(), |n| all.len().min(n as usize));
    let reader = ok(
        ctx.open().read_stream(&stream, StreamPosition::Start),
        "read_stream(Start)",
    );
    for (id, payload) in all.iter().skip(all.len() - kept) {
        entry(
            &reader,
            *id,
            payload,
            &format!("replay of concurrent entry {id}"),
        );
    }
}

fn resume_from_trimmed_id(ctx: &Ctx<'_>) {
    let max = ctx.caps.stream_max_len.unwrap_or(0);
    assert!(
        (1..=10_000).contains(&max),
        "stream_max_len {max} is outside what this case can test (1..=10000)"
    );
    let max = max as usize;
    let (a, b) = (ctx.open(), ctx.open());
    let stream = unique("trimmed");
    const EXTRA: usize = 5;
    let ids: Vec<StreamId> = (0..max + EXTRA)
        .map(|i| {
            ok(
                a.append_stream(&stream, &(i as u32).to_be_bytes()),
                "append",
            )
        })
        .collect();
    let oldest_retained = EXTRA;
    for from in [StreamPosition::After(ids[0]), StreamPosition::Start] {
        let reader = ok(b.read_stream(&stream, from), "read_stream");
        for (i, id) in ids.iter().enumerate().skip(oldest_retained) {
            entry(
                &reader,
                *id,
                &(i as u32).to_be_bytes(),
                &format!("{from:?}: retained entry {i} of {}", ids.len()),
            );
        }
    }
}
