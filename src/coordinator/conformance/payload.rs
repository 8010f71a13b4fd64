//! Payload cases that span pub/sub, streams and KV alike: every byte value
//! passes unchanged, and the size limit is enforced at exactly
//! `MAX_PAYLOAD`, the same for all three.

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{entry, expect_invalid, expect_not_found, msg, ok, put, recv};
use crate::coordinator::{KvEvent, StreamPosition, MAX_PAYLOAD};

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[
    Case {
        name: "binary payloads",
        needs: Needs::Delivery,
        run: binary,
    },
    Case {
        name: "payload size limit",
        needs: Needs::Nothing,
        run: size_limit,
    },
];

fn binary(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bytes: Vec<u8> = (0..=255u8).collect();
    let (topic, stream, bucket) = (unique("bin"), unique("bin"), unique("bin"));
    let sub = ok(b.subscribe(&topic), "subscribe");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    assert_eq!(recv(&watch, "empty bucket"), KvEvent::Synced);
    ok(a.publish(&topic, &bytes), "publish");
    msg(&sub, &topic, &bytes, "all 256 byte values via pub/sub");
    let id = ok(a.append_stream(&stream, &bytes), "append");
    let reader = ok(b.read_stream(&stream, StreamPosition::Start), "read_stream");
    entry(&reader, id, &bytes, "all 256 byte values via a stream");
    ok(a.kv_set(&bucket, "bin", &bytes), "kv_set");
    assert_eq!(
        ok(b.kv_get(&bucket, "bin"), "kv_get"),
        bytes,
        "all 256 byte values via kv_get"
    );
    assert_eq!(
        recv(&watch, "all 256 byte values via kv_watch"),
        put("bin", &bytes)
    );
}

fn size_limit(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let (topic, stream, bucket) = (unique("size"), unique("size"), unique("size"));
    let too_big = vec![0xA5; MAX_PAYLOAD + 1];
    expect_invalid(
        c.publish(&topic, &too_big),
        "payload",
        "publish above the limit",
    );
    expect_invalid(
        c.append_stream(&stream, &too_big),
        "payload",
        "append_stream above the limit",
    );
    expect_invalid(
        c.kv_set(&bucket, "k", &too_big),
        "value",
        "kv_set above the limit",
    );
    expect_not_found(c.kv_get(&bucket, "k"), "kv_get after a rejected kv_set");

    let exact = vec![0x5A; MAX_PAYLOAD];
    let sub = ctx
        .caps
        .delivers
        .then(|| ok(c.subscribe(&topic), "subscribe"));
    ok(c.publish(&topic, &exact), "publish at exactly the limit");
    let id = ok(
        c.append_stream(&stream, &exact),
        "append_stream at exactly the limit",
    );
    ok(
        c.kv_set(&bucket, "k", &exact),
        "kv_set at exactly the limit",
    );
    if let Some(sub) = sub {
        assert!(
            recv(&sub, "message at the limit").payload == exact,
            "message at the limit changed"
        );
        let reader = ok(c.read_stream(&stream, StreamPosition::Start), "read_stream");
        let e = recv(&reader, "entry at the limit");
        assert!(
            e.id == id && e.payload == exact,
            "entry at the limit changed"
        );
        assert!(
            ok(c.kv_get(&bucket, "k"), "kv_get") == exact,
            "value at the limit changed"
        );
    }
}
