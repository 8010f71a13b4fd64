//! Cases about a handle's life rather than one feature: input validation,
//! ping, and what close must do (idempotent, safe to race, `Closed` after,
//! every feed ended, other handles untouched).

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{drain_to_end, expect_closed, expect_invalid, expect_not_found, msg, ok};
use crate::coordinator::StreamPosition;

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[
    Case {
        name: "input validation",
        needs: Needs::Nothing,
        run: validation,
    },
    Case {
        name: "ping",
        needs: Needs::Nothing,
        run: ping,
    },
    Case {
        name: "close is idempotent",
        needs: Needs::Nothing,
        run: close_idempotent,
    },
    Case {
        name: "concurrent close",
        needs: Needs::Nothing,
        run: close_concurrent,
    },
    Case {
        name: "Closed after close",
        needs: Needs::Nothing,
        run: closed_after_close,
    },
    Case {
        name: "feeds end after close",
        needs: Needs::Nothing,
        run: feeds_end_on_close,
    },
];

fn validation(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let bucket = unique("validation");
    let long = "x".repeat(256);
    for bad in ["", "a/b", "a\0b", long.as_str()] {
        expect_invalid(c.publish(bad, b"x"), "topic", &format!("publish({bad:?})"));
        expect_invalid(c.subscribe(bad), "topic", &format!("subscribe({bad:?})"));
        expect_invalid(
            c.append_stream(bad, b"x"),
            "stream",
            &format!("append_stream({bad:?})"),
        );
        expect_invalid(
            c.read_stream(bad, StreamPosition::Start),
            "stream",
            &format!("read_stream({bad:?})"),
        );
        expect_invalid(
            c.kv_set(bad, "k", b"x"),
            "bucket",
            &format!("kv_set(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_get(bad, "k"),
            "bucket",
            &format!("kv_get(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_delete(bad, "k"),
            "bucket",
            &format!("kv_delete(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_watch(bad, "*"),
            "bucket",
            &format!("kv_watch(bucket {bad:?})"),
        );
        expect_invalid(
            c.kv_set(&bucket, bad, b"x"),
            "key",
            &format!("kv_set(key {bad:?})"),
        );
        expect_invalid(
            c.kv_get(&bucket, bad),
            "key",
            &format!("kv_get(key {bad:?})"),
        );
        expect_invalid(
            c.kv_delete(&bucket, bad),
            "key",
            &format!("kv_delete(key {bad:?})"),
        );
    }
    for bad in ["", "a\0*"] {
        expect_invalid(
            c.kv_watch(&bucket, bad),
            "pattern",
            &format!("kv_watch(pattern {bad:?})"),
        );
    }
    // A rejected call writes nothing.
    expect_not_found(c.kv_get(&bucket, "k"), "kv_get after rejected calls");
}

fn ping(ctx: &Ctx<'_>) {
    ok(ctx.open().ping(), "ping");
}

fn close_idempotent(ctx: &Ctx<'_>) {
    let c = ctx.open();
    ok(c.close(), "first close");
    ok(c.close(), "second close");
    expect_closed(c.ping(), "ping");
}

fn close_concurrent(ctx: &Ctx<'_>) {
    let c = ctx.open();
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..4).map(|_| s.spawn(|| c.close())).collect();
        for j in joins {
            let result = j.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            ok(result, "concurrent close");
        }
    });
    expect_closed(c.ping(), "ping");
}

fn closed_after_close(ctx: &Ctx<'_>) {
    let c = ctx.open();
    ok(c.close(), "close");
    expect_closed(c.publish("t", b"x"), "publish");
    expect_closed(c.subscribe("t"), "subscribe");
    expect_closed(c.append_stream("s", b"x"), "append_stream");
    expect_closed(c.read_stream("s", StreamPosition::Start), "read_stream");
    expect_closed(c.kv_set("b", "k", b"x"), "kv_set");
    expect_closed(c.kv_get("b", "k"), "kv_get");
    expect_closed(c.kv_delete("b", "k"), "kv_delete");
    expect_closed(c.kv_watch("b", "*"), "kv_watch");
    expect_closed(c.ping(), "ping");
}

fn feeds_end_on_close(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let (topic, stream, bucket) = (unique("end"), unique("end"), unique("end"));
    let sub = ok(a.subscribe(&topic), "subscribe");
    let reader = ok(a.read_stream(&stream, StreamPosition::Start), "read_stream");
    let watch = ok(a.kv_watch(&bucket, "*"), "kv_watch");
    let survivor = ok(b.subscribe(&topic), "subscribe on another handle");
    ok(a.close(), "close");
    drain_to_end(&sub, "subscription");
    drain_to_end(&reader, "stream reader");
    drain_to_end(&watch, "kv watch");
    if ctx.caps.delivers {
        ok(
            b.publish(&topic, b"still here"),
            "publish on another handle",
        );
        msg(
            &survivor,
            &topic,
            b"still here",
            "a feed of another handle survives the close",
        );
    }
}
