//! Pub/sub cases: delivery on the exact topic only, to every subscriber, in
//! publish order per topic, and again after resubscribing.

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{assert_quiet, msg, ok};

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[
    Case {
        name: "pub/sub exact topic",
        needs: Needs::Delivery,
        run: exact_topic,
    },
    Case {
        name: "pub/sub topic isolation",
        needs: Needs::Delivery,
        run: topic_isolation,
    },
    Case {
        name: "pub/sub multiple subscribers",
        needs: Needs::Delivery,
        run: multiple_subscribers,
    },
    Case {
        name: "pub/sub per-topic ordering",
        needs: Needs::Delivery,
        run: per_topic_ordering,
    },
    Case {
        name: "pub/sub unsubscribe and resubscribe",
        needs: Needs::Delivery,
        run: resubscribe,
    },
];

fn exact_topic(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("exact");
    let sub = ok(b.subscribe(&topic), "subscribe");
    ok(
        a.publish(&format!("{topic}x"), b"longer"),
        "publish on a longer topic",
    );
    ok(
        a.publish(&topic[..topic.len() - 1], b"shorter"),
        "publish on a prefix",
    );
    ok(a.publish(&topic, b"hit"), "publish");
    msg(&sub, &topic, b"hit", "the exact topic");
    assert_quiet(&sub, "after the exact topic");
}

fn topic_isolation(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let (t1, t2) = (unique("iso-one"), unique("iso-two"));
    let s1 = ok(b.subscribe(&t1), "subscribe one");
    let s2 = ok(b.subscribe(&t2), "subscribe two");
    ok(a.publish(&t1, b"one"), "publish one");
    ok(a.publish(&t2, b"two"), "publish two");
    msg(&s1, &t1, b"one", "topic one");
    msg(&s2, &t2, b"two", "topic two");
    assert_quiet(&s1, "topic one");
    assert_quiet(&s2, "topic two");
}

fn multiple_subscribers(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("multi");
    let subs = [
        ok(b.subscribe(&topic), "subscribe"),
        ok(b.subscribe(&topic), "subscribe"),
        ok(a.subscribe(&topic), "subscribe"),
    ];
    for i in 0..3u8 {
        ok(a.publish(&topic, &[i]), "publish");
    }
    for (n, sub) in subs.iter().enumerate() {
        for i in 0..3u8 {
            msg(sub, &topic, &[i], &format!("subscriber {n}, message {i}"));
        }
    }
}

fn per_topic_ordering(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("order");
    let remote = ok(b.subscribe(&topic), "subscribe");
    let local = ok(a.subscribe(&topic), "subscribe");
    const N: u32 = 150;
    for i in 0..N {
        ok(a.publish(&topic, &i.to_be_bytes()), "publish");
    }
    for (name, sub) in [("remote", &remote), ("local", &local)] {
        for i in 0..N {
            msg(
                sub,
                &topic,
                &i.to_be_bytes(),
                &format!("{name} subscriber, message {i} of {N}"),
            );
        }
        assert_quiet(sub, name);
    }
}

fn resubscribe(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let topic = unique("resub");
    let sub = ok(b.subscribe(&topic), "subscribe");
    ok(a.publish(&topic, b"before"), "publish");
    msg(&sub, &topic, b"before", "first subscription");
    drop(sub);
    ok(
        a.publish(&topic, b"while away"),
        "publish with no subscriber",
    );
    let again = ok(b.subscribe(&topic), "subscribe again");
    ok(a.publish(&topic, b"after"), "publish");
    msg(
        &again,
        &topic,
        b"after",
        "second subscription (live-only: nothing from before it)",
    );
    assert_quiet(&again, "second subscription");
}
