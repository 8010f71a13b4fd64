//! KV cases: set/get/delete round trips, `NotFound`, and watches (snapshot,
//! `Synced`, then updates and deletes, filtered by pattern).

use super::case::{unique, Case, Ctx, Needs};
use super::expect::{assert_quiet, expect_not_found, expect_snapshot, ok, put, recv};
use super::QUIET;
use crate::coordinator::KvEvent;
use crossbeam_channel::TryRecvError;

/// This concern's cases, in the order they run.
pub(super) const CASES: &[Case] = &[
    Case {
        name: "kv round trip",
        needs: Needs::Delivery,
        run: round_trip,
    },
    Case {
        name: "kv missing key is NotFound",
        needs: Needs::Nothing,
        run: missing_key,
    },
    Case {
        name: "kv watch snapshot, Synced, updates",
        needs: Needs::Delivery,
        run: watch_updates,
    },
    Case {
        name: "kv watch deletes",
        needs: Needs::Delivery,
        run: watch_deletes,
    },
    Case {
        name: "kv watch pattern isolation",
        needs: Needs::Delivery,
        run: watch_patterns,
    },
    Case {
        name: "kv watch Synced on an empty bucket",
        needs: Needs::Delivery,
        run: watch_empty_bucket,
    },
];

fn round_trip(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("kv");
    ok(a.kv_set(&bucket, "k", b"one"), "kv_set");
    assert_eq!(ok(a.kv_get(&bucket, "k"), "kv_get"), b"one");
    assert_eq!(
        ok(b.kv_get(&bucket, "k"), "kv_get from another handle"),
        b"one"
    );
    ok(b.kv_set(&bucket, "k", b"two"), "kv_set overwrite");
    assert_eq!(ok(a.kv_get(&bucket, "k"), "kv_get after overwrite"), b"two");
    ok(a.kv_set(&bucket, "empty", b""), "kv_set empty value");
    assert_eq!(ok(b.kv_get(&bucket, "empty"), "kv_get empty value"), b"");
    ok(a.kv_delete(&bucket, "k"), "kv_delete");
    expect_not_found(a.kv_get(&bucket, "k"), "kv_get after delete");
    expect_not_found(b.kv_get(&bucket, "k"), "kv_get after delete, other handle");
    ok(a.kv_delete(&bucket, "k"), "kv_delete of a missing key");
}

fn missing_key(ctx: &Ctx<'_>) {
    let c = ctx.open();
    let bucket = unique("missing");
    expect_not_found(c.kv_get(&bucket, "nope"), "kv_get in an unused bucket");
    ok(c.kv_set(&bucket, "other", b"x"), "kv_set");
    expect_not_found(c.kv_get(&bucket, "nope"), "kv_get of a missing key");
}

fn watch_updates(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let (bucket, elsewhere) = (unique("watch"), unique("elsewhere"));
    ok(a.kv_set(&bucket, "k1", b"v1"), "kv_set");
    ok(a.kv_set(&bucket, "k2", b"v2"), "kv_set");
    ok(a.kv_set(&elsewhere, "k3", b"other bucket"), "kv_set");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    expect_snapshot(&watch, &[("k1", b"v1"), ("k2", b"v2")], "snapshot");
    ok(a.kv_set(&elsewhere, "k4", b"other bucket"), "kv_set");
    ok(a.kv_set(&bucket, "k3", b"v3"), "kv_set");
    assert_eq!(recv(&watch, "new key"), put("k3", b"v3"));
    ok(a.kv_set(&bucket, "k1", b"v1b"), "kv_set");
    assert_eq!(recv(&watch, "changed key"), put("k1", b"v1b"));
    assert_quiet(&watch, "after updates");
}

fn watch_deletes(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("deletes");
    ok(a.kv_set(&bucket, "k1", b"v1"), "kv_set");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    expect_snapshot(&watch, &[("k1", b"v1")], "snapshot");
    ok(a.kv_delete(&bucket, "k1"), "kv_delete");
    assert_eq!(
        recv(&watch, "delete"),
        KvEvent::Deleted { key: "k1".into() }
    );
    ok(
        a.kv_delete(&bucket, "never-set"),
        "kv_delete of a missing key",
    );
    ok(a.kv_set(&bucket, "k2", b"v2"), "kv_set");
    assert_eq!(
        recv(
            &watch,
            "the set after deleting a missing key (which reports nothing)"
        ),
        put("k2", b"v2")
    );
}

fn watch_patterns(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("patterns");
    for key in ["app.one", "apx.one", "other", "others"] {
        ok(a.kv_set(&bucket, key, key.as_bytes()), "kv_set");
    }
    let star = ok(b.kv_watch(&bucket, "app.*"), "kv_watch(app.*)");
    let question = ok(b.kv_watch(&bucket, "ap?.one"), "kv_watch(ap?.one)");
    let literal = ok(b.kv_watch(&bucket, "other"), "kv_watch(other)");
    expect_snapshot(&star, &[("app.one", b"app.one")], "app.* snapshot");
    expect_snapshot(
        &question,
        &[("app.one", b"app.one"), ("apx.one", b"apx.one")],
        "ap?.one snapshot",
    );
    expect_snapshot(&literal, &[("other", b"other")], "other snapshot");
    // Each watcher's first event must be its own key: bucket order proves
    // the earlier non-matching sets were not delivered.
    for key in ["otherz", "apx.two", "ap.one", "app.two", "apy.one", "other"] {
        ok(a.kv_set(&bucket, key, key.as_bytes()), "kv_set");
    }
    assert_eq!(recv(&star, "app.*"), put("app.two", b"app.two"));
    assert_eq!(recv(&question, "ap?.one"), put("apy.one", b"apy.one"));
    assert_eq!(recv(&literal, "other"), put("other", b"other"));
    std::thread::sleep(QUIET);
    for (name, w) in [
        ("app.*", &star),
        ("ap?.one", &question),
        ("other", &literal),
    ] {
        match w.try_recv() {
            Err(TryRecvError::Empty) => {}
            other => panic!("{name}: unexpected {other:?}"),
        }
    }
}

fn watch_empty_bucket(ctx: &Ctx<'_>) {
    let (a, b) = (ctx.open(), ctx.open());
    let bucket = unique("empty");
    let watch = ok(b.kv_watch(&bucket, "*"), "kv_watch");
    assert_eq!(recv(&watch, "empty bucket"), KvEvent::Synced);
    ok(a.kv_set(&bucket, "k", b"v"), "kv_set");
    assert_eq!(recv(&watch, "first set"), put("k", b"v"));
    assert_quiet(&watch, "after the first set");
}
