//! Exact notice and command sequences for hand-built cases.

use crate::support::{delete_event, drain, put_event};
use fleetcoord_sm::rpc::RpcError;
use fleetcoord_sm::watch::*;
use fleetcoord_sm::*;
#[allow(unused_imports)]
use std::time::{Duration, Instant};

const MS: Duration = Duration::from_millis(1);

fn config() -> WatchConfig {
    WatchConfig {
        prefix: b"/h/".to_vec(),
        keys: KeyRule::HostId,
        backoff: BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2,
            jitter_percent: 0,
        },
        page_size: DEFAULT_PAGE_SIZE,
    }
}

/// Tests need some instant to start from; the machine itself never reads a clock.
fn start() -> Instant {
    Instant::now()
}

fn host(n: u32) -> Vec<u8> {
    format!("/h/00000000-0000-0000-0000-{n:012x}").into_bytes()
}

fn kv(key: &[u8], value: &str, create: Revision, modified: Revision) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: value.as_bytes().to_vec(),
        create_revision: create,
        mod_revision: modified,
        version: 1,
        lease: 7,
    }
}

fn put(kv: KeyValue) -> WatchEvent {
    put_event(kv)
}

fn del(key: &[u8], revision: Revision) -> WatchEvent {
    delete_event(key.to_vec(), revision)
}

fn ok(id: RpcId, response: Response) -> WatchInput {
    WatchInput::Rpc(RpcReply {
        id,
        result: Ok(response),
    })
}

fn failed(id: RpcId) -> WatchInput {
    WatchInput::Rpc(RpcReply {
        id,
        result: Err(RpcError::Unavailable("gone".into())),
    })
}

fn range_cmd(id: u64) -> Command<WatchNotice> {
    Command::Rpc {
        id: RpcId(id),
        request: Request::Range(RangeRequest {
            // One key past the page: an answer without it is the last page.
            limit: DEFAULT_PAGE_SIZE + 1,
            ..RangeRequest::all(KeyRange::Prefix(b"/h/".to_vec()))
        }),
    }
}

fn watch_cmd(id: u64, start_revision: Revision) -> Command<WatchNotice> {
    Command::Rpc {
        id: RpcId(id),
        request: Request::Watch {
            range: KeyRange::Prefix(b"/h/".to_vec()),
            start_revision,
        },
    }
}

fn n(notice: WatchNotice) -> Command<WatchNotice> {
    Command::Notify(notice)
}

/// A machine that replayed `kvs` at revision 10 and whose watch (id 1) is
/// established.
fn live_with(now: Instant, kvs: Vec<KeyValue>) -> Watch {
    let mut w = Watch::new(config(), now, 1);
    assert_eq!(drain(&mut w), vec![range_cmd(0)]);
    w.handle(now, ok(RpcId(0), Response::Range { revision: 10, kvs }));
    drain(&mut w);
    w.handle(now, ok(RpcId(1), Response::WatchEvents { events: vec![] }));
    assert!(drain(&mut w).is_empty());
    assert!(w.is_live());
    w
}

#[test]
fn replays_the_snapshot_in_key_order_then_synced_then_watches_from_the_next_revision() {
    let t0 = start();
    let mut w = Watch::new(config(), t0, 1);
    assert_eq!(drain(&mut w), vec![range_cmd(0)]);
    assert!(!w.is_synced());
    let (a, b) = (kv(&host(1), "a", 3, 4), kv(&host(2), "b", 5, 5));
    let bad = kv(b"/h/not-a-uuid", "x", 6, 6);
    let outside = kv(b"/other", "x", 2, 2);
    let snapshot = vec![bad.clone(), b.clone(), outside, a.clone()];
    w.handle(
        t0,
        ok(
            RpcId(0),
            Response::Range {
                revision: 10,
                kvs: snapshot,
            },
        ),
    );
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(a.clone())),
            n(WatchNotice::Up(b.clone())),
            n(WatchNotice::InvalidKey(bad.key)),
            n(WatchNotice::Synced),
            watch_cmd(1, 11),
        ]
    );
    assert!(w.is_synced());
    assert!(!w.is_live(), "live only once the watch answers");
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a, b]);
    assert_eq!(w.poll_timeout(), None);
}

#[test]
fn repeated_events_are_ignored_and_one_revision_may_carry_several_events() {
    let t0 = start();
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    let mut w = live_with(t0, vec![a.clone(), b.clone()]);
    let c = kv(&host(3), "c", 11, 11);
    let a2 = kv(&host(1), "a2", 3, 12);
    // Revision 9 and 10 are already in the snapshot: a repeat after reconnect.
    let stale = put(kv(&host(9), "old", 9, 9));
    w.handle(
        t0,
        ok(
            RpcId(1),
            Response::WatchEvents {
                events: vec![stale, put(c.clone())],
            },
        ),
    );
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Up(c.clone()))]);
    // etcd repeats revision 11 and then a lease revoke deletes two keys at 13.
    let events = vec![
        put(c.clone()),
        put(a2.clone()),
        del(&host(2), 13),
        del(&host(3), 13),
    ];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Updated(a2.clone())),
            n(WatchNotice::Down(b)),
            n(WatchNotice::Down(c)),
        ]
    );
    // The same batch again changes nothing.
    let events = vec![put(a2.clone()), del(&host(2), 13)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert!(drain(&mut w).is_empty());
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a2]);
}

#[test]
fn a_put_with_a_new_create_revision_is_down_then_up_and_unknown_deletes_are_silent() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let mut w = live_with(t0, vec![a.clone()]);
    let reborn = kv(&host(1), "again", 12, 12);
    let events = vec![
        del(&host(5), 11),
        put(reborn.clone()),
        put(kv(b"/x", "y", 13, 13)),
    ];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Down(a)), n(WatchNotice::Up(reborn))]
    );
}

#[test]
fn compaction_resyncs_with_a_diff_against_the_known_set() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let b = kv(&host(2), "b-last-seen", 4, 8);
    let c = kv(&host(3), "c", 5, 5);
    let same = kv(&host(4), "same", 6, 6);
    let mut w = live_with(t0, vec![a, b.clone(), c.clone(), same.clone()]);
    w.handle(
        t0,
        ok(
            RpcId(1),
            Response::WatchCanceled {
                compact_revision: 20,
            },
        ),
    );
    // The snapshot is read at once: a compaction is no failure to back
    // off from.
    assert_eq!(
        drain(&mut w),
        vec![Command::Cancel { id: RpcId(1) }, range_cmd(2)]
    );
    assert!(!w.is_live());
    assert_eq!(w.poll_timeout(), None);
    let a2 = kv(&host(1), "a2", 3, 21);
    let c2 = kv(&host(3), "c2", 22, 22);
    let d = kv(&host(5), "d", 23, 23);
    let snapshot = vec![a2.clone(), c2.clone(), same.clone(), d.clone()];
    w.handle(
        t0 + 101 * MS,
        ok(
            RpcId(2),
            Response::Range {
                revision: 30,
                kvs: snapshot,
            },
        ),
    );
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Updated(a2.clone())),
            n(WatchNotice::Down(b)),
            n(WatchNotice::Down(c)),
            n(WatchNotice::Up(c2.clone())),
            n(WatchNotice::Up(d.clone())),
            watch_cmd(3, 31),
        ]
    );
    assert_eq!(
        w.known().cloned().collect::<Vec<_>>(),
        vec![a2, c2, same, d]
    );
}

#[test]
fn invalid_keys_are_reported_once_whatever_path_they_come_by() {
    let t0 = start();
    let bad = kv(b"/h/BAD", "x", 3, 3);
    let mut w = Watch::new(config(), t0, 1);
    drain(&mut w);
    w.handle(
        t0,
        ok(
            RpcId(0),
            Response::Range {
                revision: 10,
                kvs: vec![bad.clone()],
            },
        ),
    );
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::InvalidKey(bad.key.clone())),
            n(WatchNotice::Synced),
            watch_cmd(1, 11)
        ]
    );
    let other = kv(b"/h/worse", "x", 11, 11);
    let events = vec![
        put(kv(b"/h/BAD", "y", 3, 11)),
        put(other.clone()),
        del(b"/h/BAD", 12),
    ];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::InvalidKey(other.key.clone()))]
    );
    w.handle(t0, failed(RpcId(1)));
    drain(&mut w);
    w.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(drain(&mut w), vec![range_cmd(2)]);
    w.handle(
        t0 + Duration::from_secs(1),
        ok(
            RpcId(2),
            Response::Range {
                revision: 12,
                kvs: vec![bad, other],
            },
        ),
    );
    assert_eq!(drain(&mut w), vec![watch_cmd(3, 13)]);
    assert_eq!(w.known().count(), 0);
}

#[test]
fn a_full_consumer_pauses_everything_and_ready_resyncs() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let mut w = live_with(t0, vec![a.clone()]);
    w.handle(t0, WatchInput::ConsumerFull);
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(1) }]);
    assert!(!w.is_live());
    let b = kv(&host(2), "b", 11, 11);
    w.handle(
        t0,
        ok(
            RpcId(1),
            Response::WatchEvents {
                events: vec![put(b.clone())],
            },
        ),
    );
    w.handle(t0, WatchInput::ConsumerFull);
    assert!(
        drain(&mut w).is_empty(),
        "nothing while the consumer is full"
    );
    assert_eq!(w.poll_timeout(), None);
    w.handle(t0 + MS, WatchInput::ConsumerReady);
    assert_eq!(drain(&mut w), vec![range_cmd(2)]);
    w.handle(t0 + MS, WatchInput::ConsumerReady);
    assert!(drain(&mut w).is_empty(), "one request at a time");
    let snapshot = vec![kv(&host(1), "a", 3, 3), b.clone()];
    w.handle(
        t0 + MS,
        ok(
            RpcId(2),
            Response::Range {
                revision: 11,
                kvs: snapshot,
            },
        ),
    );
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Up(b)), watch_cmd(3, 12)]);
}

#[test]
fn a_full_consumer_before_the_first_snapshot_still_gets_synced_exactly_once() {
    let t0 = start();
    let mut w = Watch::new(config(), t0, 1);
    drain(&mut w);
    w.handle(t0, WatchInput::ConsumerFull);
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(0) }]);
    let a = kv(&host(1), "a", 3, 3);
    w.handle(
        t0,
        ok(
            RpcId(0),
            Response::Range {
                revision: 10,
                kvs: vec![a.clone()],
            },
        ),
    );
    assert!(drain(&mut w).is_empty(), "the canceled range is late");
    assert!(!w.is_synced());
    w.handle(t0, WatchInput::ConsumerReady);
    assert_eq!(drain(&mut w), vec![range_cmd(1)]);
    w.handle(
        t0,
        ok(
            RpcId(1),
            Response::Range {
                revision: 10,
                kvs: vec![a.clone()],
            },
        ),
    );
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(a)),
            n(WatchNotice::Synced),
            watch_cmd(2, 11)
        ]
    );
}

#[test]
fn failures_back_off_exponentially_and_an_established_watch_resets_the_backoff() {
    let t0 = start();
    let mut w = Watch::new(config(), t0, 1);
    drain(&mut w);
    let mut now = t0;
    let mut id = 0;
    for delay_ms in [100u32, 200, 400, 800, 1000] {
        w.handle(now, failed(RpcId(id)));
        assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(id) }]);
        assert_eq!(w.poll_timeout(), Some(now + delay_ms * MS));
        now += delay_ms * MS;
        w.handle_timeout(now);
        id += 1;
        assert_eq!(drain(&mut w), vec![range_cmd(id)]);
    }
    // A wrong variant counts as a failure too.
    w.handle(now, ok(RpcId(id), Response::Revoked));
    drain(&mut w);
    assert_eq!(w.poll_timeout(), Some(now + 1000 * MS));
    now += 1000 * MS;
    w.handle_timeout(now);
    id += 1;
    drain(&mut w);
    w.handle(
        now,
        ok(
            RpcId(id),
            Response::Range {
                revision: 5,
                kvs: vec![],
            },
        ),
    );
    id += 1;
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Synced), watch_cmd(id, 6)]
    );
    // The watch is refused before it is established: the backoff still grows.
    w.handle(now, ok(RpcId(id), Response::Put { revision: 3 }));
    drain(&mut w);
    assert_eq!(w.poll_timeout(), Some(now + 1000 * MS));
    now += 1000 * MS;
    w.handle_timeout(now);
    drain(&mut w);
    id += 1;
    w.handle(
        now,
        ok(
            RpcId(id),
            Response::Range {
                revision: 5,
                kvs: vec![],
            },
        ),
    );
    drain(&mut w);
    id += 1;
    w.handle(now, ok(RpcId(id), Response::WatchEvents { events: vec![] }));
    assert!(w.is_live());
    w.handle(now, failed(RpcId(id)));
    drain(&mut w);
    assert_eq!(
        w.poll_timeout(),
        Some(now + 100 * MS),
        "reset after an established watch"
    );
}

#[test]
fn late_replies_and_unknown_ids_are_ignored() {
    let t0 = start();
    let mut w = live_with(t0, vec![]);
    w.handle(t0, failed(RpcId(0)));
    w.handle(
        t0,
        ok(
            RpcId(77),
            Response::WatchCanceled {
                compact_revision: 3,
            },
        ),
    );
    w.handle(
        t0,
        ok(
            RpcId(0),
            Response::Range {
                revision: 99,
                kvs: vec![kv(&host(1), "a", 1, 1)],
            },
        ),
    );
    assert!(drain(&mut w).is_empty());
    assert!(w.is_live());
    assert_eq!(w.known().count(), 0);
}

#[test]
fn stop_cancels_and_then_nothing_happens() {
    let t0 = start();
    let mut w = Watch::new(config(), t0, 1);
    drain(&mut w);
    w.handle(t0, failed(RpcId(0)));
    drain(&mut w);
    assert!(w.poll_timeout().is_some());
    w.handle(t0, WatchInput::Stop);
    assert!(
        drain(&mut w).is_empty(),
        "nothing outstanding to cancel while waiting"
    );
    assert_eq!(w.poll_timeout(), None);
    w.handle_timeout(t0 + Duration::from_secs(10));
    w.handle(t0 + Duration::from_secs(10), WatchInput::ConsumerReady);
    assert!(drain(&mut w).is_empty());

    let mut w = live_with(t0, vec![]);
    w.handle(t0, WatchInput::Stop);
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(1) }]);
    w.handle(
        t0,
        ok(
            RpcId(1),
            Response::WatchEvents {
                events: vec![put(kv(&host(1), "a", 11, 11))],
            },
        ),
    );
    assert!(drain(&mut w).is_empty());
    assert!(!w.is_live());
}

#[test]
fn poll_timeout_is_never_before_the_last_now() {
    let t0 = start();
    let mut w = Watch::new(config(), t0, 1);
    drain(&mut w);
    w.handle(t0, failed(RpcId(0)));
    drain(&mut w);
    let later = t0 + Duration::from_secs(5);
    w.handle(later, WatchInput::ConsumerReady);
    assert_eq!(w.poll_timeout(), Some(later));
}

fn paged(page_size: i64) -> WatchConfig {
    WatchConfig {
        page_size,
        ..config()
    }
}

/// The read of a snapshot page of `page` keys: it asks for one key more
/// (an answer without it is the last page), except a one-key page.
fn page_cmd(id: u64, page: i64, after: Option<&[u8]>, revision: Revision) -> Command<WatchNotice> {
    let limit = if page > 1 { page + 1 } else { page };
    let range = match after {
        None => KeyRange::Prefix(b"/h/".to_vec()),
        Some(last) => KeyRange::PrefixFrom {
            prefix: b"/h/".to_vec(),
            from: rpc::key_after(last),
        },
    };
    Command::Rpc {
        id: RpcId(id),
        request: Request::Range(RangeRequest {
            limit,
            revision,
            ..RangeRequest::all(range)
        }),
    }
}

fn page(id: u64, header: Revision, kvs: Vec<KeyValue>) -> WatchInput {
    ok(
        RpcId(id),
        Response::Range {
            revision: header,
            kvs,
        },
    )
}

fn refused(id: u64, error: RpcError) -> WatchInput {
    WatchInput::Rpc(RpcReply {
        id: RpcId(id),
        result: Err(error),
    })
}

#[test]
fn the_first_snapshot_streams_each_page_at_the_first_pages_revision_then_synced() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    assert_eq!(drain(&mut w), vec![page_cmd(0, 2, None, 0)]);
    let (a, b, c) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 4),
        kv(&host(3), "c", 5, 5),
    );
    // c is the lookahead key: it says more follow, and is not told yet.
    w.handle(t0, page(0, 10, vec![a.clone(), b.clone(), c.clone()]));
    // The next page is asked for first: etcd reads it while the consumer
    // is handed this one.
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(1, 2, Some(&host(2)), 10),
            n(WatchNotice::Up(a.clone())),
            n(WatchNotice::Up(b.clone())),
        ]
    );
    assert!(!w.is_synced());
    // Later pages carry the current revision in their header: ignored.
    w.handle(t0, page(1, 12, vec![c.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(c)),
            n(WatchNotice::Synced),
            watch_cmd(2, 11)
        ]
    );
    assert!(w.is_synced());
}

/// etcd never repeats a key in a later page (each starts after the last
/// key of the one before), but the view takes nothing on trust: a key
/// already told about is described as a change, never as a second `Up`.
#[test]
fn a_later_page_repeating_known_keys_is_read_as_their_changes() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    let c = kv(&host(3), "c", 5, 5);
    w.handle(t0, page(0, 10, vec![a.clone(), b.clone(), c.clone()]));
    drain(&mut w);
    let a2 = kv(&host(1), "a2", 3, 9); // same key, written again
    let b2 = kv(&host(2), "b2", 8, 8); // deleted and created again

    // The last page (no lookahead key) repeats a and b.
    w.handle(t0, page(1, 10, vec![a2.clone(), b2.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Updated(a2.clone())),
            n(WatchNotice::Down(b)),
            n(WatchNotice::Up(b2.clone())),
            n(WatchNotice::Synced),
            watch_cmd(2, 11)
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a2, b2]);
}

/// A page that fills its size but has no lookahead key is the last: no
/// empty page is read after it (a prefix of exactly 1,000 hosts is one
/// read, as a raw read stopping on etcd's `more` flag is).
#[test]
fn a_full_page_without_its_lookahead_key_is_the_last() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    w.handle(t0, page(0, 10, vec![a.clone(), b.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(a.clone())),
            n(WatchNotice::Up(b.clone())),
            n(WatchNotice::Synced),
            watch_cmd(1, 11)
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a, b]);
}

/// Page size 2, first snapshot [a, b] + [c] at revision 10, watch (id 2)
/// established.
fn live_paged(now: Instant) -> (Watch, [KeyValue; 3]) {
    let mut w = Watch::new(paged(2), now, 1);
    let (a, b, c) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 4),
        kv(&host(3), "c", 5, 5),
    );
    drain(&mut w);
    w.handle(now, page(0, 10, vec![a.clone(), b.clone(), c.clone()]));
    drain(&mut w);
    w.handle(now, page(1, 10, vec![c.clone()]));
    drain(&mut w);
    w.handle(now, ok(RpcId(2), Response::WatchEvents { events: vec![] }));
    assert!(w.is_live());
    (w, [a, b, c])
}

#[test]
fn a_resync_collects_every_page_and_emits_the_diff_after_the_last() {
    let t0 = start();
    let (mut w, [_, b, c]) = live_paged(t0);
    w.handle(t0, failed(RpcId(2)));
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(2) }]);
    let t1 = t0 + 100 * MS;
    w.handle_timeout(t1);
    assert_eq!(drain(&mut w), vec![page_cmd(3, 2, None, 0)]);
    // a changed, b unchanged: nothing is said before the last page.
    let a2 = kv(&host(1), "a2", 3, 15);
    // c vanished, d is new (and the first page's lookahead key).
    let d = kv(&host(4), "d", 16, 16);
    w.handle(t1, page(3, 20, vec![a2.clone(), b.clone(), d.clone()]));
    assert_eq!(drain(&mut w), vec![page_cmd(4, 2, Some(&host(2)), 20)]);
    w.handle(t1, page(4, 21, vec![d.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Updated(a2.clone())),
            n(WatchNotice::Down(c)),
            n(WatchNotice::Up(d.clone())),
            watch_cmd(5, 21),
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a2, b, d]);
}

#[test]
fn compaction_between_pages_restarts_the_snapshot_at_the_current_revision() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let (a, b, c) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 4),
        kv(&host(3), "c", 5, 5),
    );
    w.handle(t0, page(0, 10, vec![a.clone(), b.clone(), c.clone()]));
    drain(&mut w);
    w.handle(
        t0,
        refused(
            1,
            RpcError::Compacted {
                compact_revision: 12,
            },
        ),
    );
    // At once, no backoff: a fresh snapshot from the first page.
    assert_eq!(drain(&mut w), vec![page_cmd(2, 2, None, 0)]);
    assert_eq!(w.poll_timeout(), None);
    // The consumer already has a and b: this snapshot is a diff.
    w.handle(t0, page(2, 15, vec![b.clone(), c.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Down(a)),
            n(WatchNotice::Up(c.clone())),
            n(WatchNotice::Synced),
            watch_cmd(3, 16),
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![b, c]);
}

#[test]
fn a_refused_page_is_halved_down_to_one_key_then_the_watch_fails() {
    let t0 = start();
    let mut w = Watch::new(paged(4), t0, 1);
    drain(&mut w);
    let a = kv(&host(1), "a", 3, 3);
    let big = || RpcError::Rejected("decoded message length too large".into());
    w.handle(t0, refused(0, big()));
    assert_eq!(drain(&mut w), vec![page_cmd(1, 2, None, 0)]);
    w.handle(
        t0,
        page(
            1,
            10,
            vec![a.clone(), kv(&host(2), "b", 4, 4), kv(&host(3), "c", 5, 5)],
        ),
    );
    let b = kv(&host(2), "b", 4, 4);
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(2, 2, Some(&host(2)), 10),
            n(WatchNotice::Up(a)),
            n(WatchNotice::Up(b)),
        ]
    );
    // The smaller page holds for the rest of the snapshot and halves again.
    w.handle(t0, refused(2, big()));
    assert_eq!(drain(&mut w), vec![page_cmd(3, 1, Some(&host(2)), 10)]);
    w.handle(t0, refused(3, big()));
    assert_eq!(
        drain(&mut w),
        vec![
            Command::Cancel { id: RpcId(3) },
            n(WatchNotice::Failed(big())),
        ]
    );
    assert_eq!(w.poll_timeout(), None);
    assert!(w.is_finished());
    // Nothing more, whatever comes.
    w.handle(t0, WatchInput::ConsumerReady);
    w.handle_timeout(t0 + Duration::from_secs(60));
    assert!(drain(&mut w).is_empty());
}

#[test]
fn a_permanent_error_fails_the_watch_instead_of_retrying_forever() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let denied = RpcError::PermissionDenied("etcdserver: permission denied".into());
    w.handle(t0, refused(0, denied.clone()));
    assert_eq!(
        drain(&mut w),
        vec![
            Command::Cancel { id: RpcId(0) },
            n(WatchNotice::Failed(denied)),
        ]
    );
    assert_eq!(w.poll_timeout(), None);
    assert!(w.is_finished());
}

#[test]
fn a_transient_error_retries_the_same_page_at_the_same_revision() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    w.handle(t0, page(0, 10, vec![a, b, kv(&host(3), "c", 5, 5)]));
    drain(&mut w);
    w.handle(t0, failed(RpcId(1)));
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(1) }]);
    assert_eq!(w.poll_timeout(), Some(t0 + 100 * MS));
    w.handle_timeout(t0 + 100 * MS);
    assert_eq!(drain(&mut w), vec![page_cmd(2, 2, Some(&host(2)), 10)]);
    w.handle(t0 + 100 * MS, page(2, 11, vec![]));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Synced), watch_cmd(3, 11)]
    );
}

#[test]
fn a_full_consumer_in_the_first_snapshot_continues_it_from_the_next_page() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let (a, b, c) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 4),
        kv(&host(3), "c", 5, 5),
    );
    w.handle(t0, page(0, 10, vec![a.clone(), b.clone(), c.clone()]));
    drain(&mut w);
    w.handle(t0, WatchInput::ConsumerFull);
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(1) }]);
    assert_eq!(w.poll_timeout(), None);
    w.handle(t0, WatchInput::ConsumerReady);
    assert_eq!(drain(&mut w), vec![page_cmd(2, 2, Some(&host(2)), 10)]);
    w.handle(t0, page(2, 30, vec![c.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(c)),
            n(WatchNotice::Synced),
            watch_cmd(3, 11)
        ]
    );
}

#[test]
fn a_full_page_that_does_not_advance_inside_the_prefix_is_not_used() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let (a, b, c) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 4),
        kv(&host(3), "c", 5, 5),
    );
    w.handle(t0, page(0, 10, vec![a.clone(), b.clone(), c.clone()]));
    // The next page is asked for first: etcd reads it while the consumer
    // is handed this one.
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(1, 2, Some(&host(2)), 10),
            n(WatchNotice::Up(a.clone())),
            n(WatchNotice::Up(b.clone())),
        ]
    );
    // A full page ending before where this one started: nothing from it
    // is told, and the snapshot is read again from the start.
    w.handle(t0, page(1, 10, vec![c.clone(), a.clone(), b.clone()]));
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(1) }]);
    assert_eq!(w.poll_timeout(), Some(t0 + 100 * MS));
    let t1 = t0 + 100 * MS;
    w.handle_timeout(t1);
    assert_eq!(drain(&mut w), vec![page_cmd(2, 2, None, 0)]);
    // A full page ending outside the prefix is as wrong.
    let stranger = kv(b"/i/x", "x", 6, 6);
    w.handle(t1, page(2, 12, vec![c.clone(), stranger.clone(), stranger]));
    assert_eq!(drain(&mut w), vec![Command::Cancel { id: RpcId(2) }]);
    let t2 = t1 + 200 * MS;
    assert_eq!(w.poll_timeout(), Some(t2));
    w.handle_timeout(t2);
    assert_eq!(drain(&mut w), vec![page_cmd(3, 2, None, 0)]);
    // The consumer already has a and b: this snapshot is a diff.
    w.handle(t2, page(3, 12, vec![a.clone(), b.clone(), c.clone()]));
    assert_eq!(drain(&mut w), vec![page_cmd(4, 2, Some(&host(2)), 12)]);
    w.handle(t2, page(4, 12, vec![c.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(c.clone())),
            n(WatchNotice::Synced),
            watch_cmd(5, 13)
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a, b, c]);
}

// ---- Leave markers: `Left` versus `Down` ("Leave or expiry" in the docs).

fn marker(n: u32) -> Vec<u8> {
    leave_marker_key(&host(n))
}

/// `kv` on `lease`.
fn on(lease: LeaseId, mut kv: KeyValue) -> KeyValue {
    kv.lease = lease;
    kv
}

/// A compaction cancels the live watch (id `watch`); the fresh snapshot
/// (read with id `watch + 1`) is `kvs` at `revision`. Returns the notices.
fn resync_to(
    w: &mut Watch,
    now: Instant,
    watch: u64,
    revision: Revision,
    kvs: Vec<KeyValue>,
) -> Vec<Command<WatchNotice>> {
    w.handle(
        now,
        ok(
            RpcId(watch),
            Response::WatchCanceled {
                compact_revision: revision,
            },
        ),
    );
    assert_eq!(
        drain(w),
        vec![Command::Cancel { id: RpcId(watch) }, range_cmd(watch + 1)]
    );
    w.handle(now, ok(RpcId(watch + 1), Response::Range { revision, kvs }));
    drain(w)
}

#[test]
fn a_marker_then_the_revoke_is_left_whichever_delete_comes_first() {
    let t0 = start();
    let (a, b) = (kv(&host(1), "a", 3, 3), on(8, kv(&host(2), "b", 4, 4)));
    let mut w = live_with(t0, vec![a.clone(), b.clone()]);
    let events = vec![
        put(kv(&marker(1), "", 11, 11)),
        put(on(8, kv(&marker(2), "", 12, 12))),
    ];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![], "a marker is never reported");
    assert_eq!(w.known().count(), 2);
    // etcd lists a revoke's deletes in key order (host key first); the
    // other order must read the same.
    let events = vec![del(&host(1), 13), del(&marker(1), 13)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&marker(2), 14), del(&host(2), 14)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Left(a)), n(WatchNotice::Left(b))]
    );
    assert_eq!(w.known().count(), 0);
}

#[test]
fn the_marker_written_by_the_revision_that_deletes_the_key_is_a_leave() {
    // `HostLiveness::close`: one transaction puts the marker on the host's
    // lease and deletes the host key; the revoke removes the marker later.
    let t0 = start();
    let (a, b) = (kv(&host(1), "a", 3, 3), on(8, kv(&host(2), "b", 4, 4)));
    let mut w = live_with(t0, vec![a.clone(), b.clone()]);
    // In either order etcd lists them.
    let events = vec![put(kv(&marker(1), "", 11, 11)), del(&host(1), 11)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&host(2), 12), put(on(8, kv(&marker(2), "", 12, 12)))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Left(a)), n(WatchNotice::Left(b))]
    );
    // The revokes delete the markers alone: nothing more to tell.
    let events = vec![del(&marker(1), 13)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&marker(2), 14)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![]);
    assert_eq!(w.known().count(), 0);
}

#[test]
fn a_marker_written_with_the_delete_on_another_lease_is_no_leave() {
    let t0 = start();
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    let mut w = live_with(t0, vec![a.clone(), b.clone()]);
    let events = vec![put(on(99, kv(&marker(1), "", 11, 11))), del(&host(1), 11)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    // Nor one written in the revision before the delete's.
    let events = vec![put(on(99, kv(&marker(2), "", 12, 12)))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&host(2), 13)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Down(a)), n(WatchNotice::Down(b))]
    );
}

#[test]
fn a_delete_without_a_marker_is_down() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let mut w = live_with(t0, vec![a.clone()]);
    w.handle(
        t0,
        ok(
            RpcId(1),
            Response::WatchEvents {
                events: vec![del(&host(1), 11)],
            },
        ),
    );
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Down(a))]);
}

#[test]
fn a_marker_deleted_at_another_revision_than_the_host_key_is_no_leave() {
    // Another client deleted the host key alone (the marker's lease lives
    // on), or the marker alone before the lease expired: not a revoke.
    let t0 = start();
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    let mut w = live_with(t0, vec![a.clone(), b.clone()]);
    let events = vec![
        put(kv(&marker(1), "", 11, 11)),
        put(kv(&marker(2), "", 12, 12)),
        del(&host(1), 13),
        del(&marker(2), 14),
        del(&host(2), 15),
    ];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Down(a)), n(WatchNotice::Down(b))]
    );
}

#[test]
fn a_marker_on_another_lease_is_no_leave() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let mut w = live_with(t0, vec![a.clone()]);
    let events = vec![put(on(99, kv(&marker(1), "", 11, 11)))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    // Both deleted at once (by a transaction, say), but the marker did not
    // go with the host's lease.
    let events = vec![del(&host(1), 12), del(&marker(1), 12)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Down(a))]);
    // Nor does a marker without a lease.
    let b = on(0, kv(&host(2), "b", 13, 13));
    let events = vec![put(b.clone()), put(on(0, kv(&marker(2), "", 14, 14)))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&host(2), 15), del(&marker(2), 15)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Up(b.clone())), n(WatchNotice::Down(b))]
    );
}

#[test]
fn a_marker_of_an_unknown_host_is_silent_and_marks_nothing_later() {
    let t0 = start();
    let mut w = live_with(t0, vec![]);
    let events = vec![put(kv(&marker(5), "", 11, 11))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![], "neither a host nor an invalid key");
    // The host appears after its (stale) marker: the marker is older than
    // the registration, so it announces nothing about it.
    let e = kv(&host(5), "e", 12, 12);
    let events = vec![put(e.clone())];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&host(5), 13), del(&marker(5), 13)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Up(e.clone())), n(WatchNotice::Down(e))]
    );
    // A marker of a key that is no host id is an invalid key like any other.
    let odd = b"/h/not-a-host/left".to_vec();
    let events = vec![put(kv(&odd, "", 14, 14))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![n(WatchNotice::InvalidKey(odd))]);
}

#[test]
fn a_marker_in_the_snapshot_is_not_replayed_and_makes_the_revoke_a_leave() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let m = kv(&marker(1), "", 5, 5);
    let mut w = Watch::new(config(), t0, 1);
    let _ = drain(&mut w);
    w.handle(
        t0,
        ok(
            RpcId(0),
            Response::Range {
                revision: 10,
                kvs: vec![a.clone(), m],
            },
        ),
    );
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(a.clone())),
            n(WatchNotice::Synced),
            watch_cmd(1, 11)
        ]
    );
    let events = vec![del(&host(1), 11), del(&marker(1), 11)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Left(a))]);
}

#[test]
fn a_new_registration_after_a_leave_starts_without_one() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let mut w = live_with(t0, vec![a.clone()]);
    let events = vec![put(kv(&marker(1), "", 11, 11))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&host(1), 12), del(&marker(1), 12)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    // Back on a new lease; then it expires.
    let again = on(8, kv(&host(1), "again", 13, 13));
    let events = vec![put(again.clone())];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&host(1), 14)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Left(a)),
            n(WatchNotice::Up(again.clone())),
            n(WatchNotice::Down(again))
        ]
    );
    // A marker left over on the same lease from before a re-creation of
    // the key (someone deleted it and put it again) is older than the
    // registration: no leave either.
    let b = kv(&host(2), "b", 15, 15);
    let events = vec![put(b.clone()), put(kv(&marker(2), "", 16, 16))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let b2 = kv(&host(2), "b2", 18, 18);
    let events = vec![del(&host(2), 17)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![put(b2.clone())];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&host(2), 19), del(&marker(2), 19)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(b.clone())),
            n(WatchNotice::Down(b)),
            n(WatchNotice::Up(b2.clone())),
            n(WatchNotice::Down(b2))
        ]
    );
}

#[test]
fn a_resync_reads_a_leave_from_a_marker_there_now_or_seen_before_and_gone_now() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let b = kv(&host(2), "b", 4, 4);
    let c = kv(&host(3), "c", 5, 5);
    let d = kv(&host(4), "d", 6, 6);
    let mut w = live_with(t0, vec![a.clone(), b.clone(), c.clone(), d.clone()]);
    // a and b announced their leave while watched; c and d did not.
    let mb = kv(&marker(2), "", 12, 12);
    let events = vec![put(kv(&marker(1), "", 11, 11)), put(mb.clone())];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![]);
    // Disconnected meanwhile: a and its marker are gone (revoked); b's key
    // is gone and its marker still there (what a one-transaction leave
    // leaves until its revoke); c is gone without a marker; d left while
    // unwatched and came back re-registered (its marker never seen).
    let d2 = on(8, kv(&host(4), "d2", 25, 25));
    let notices = resync_to(&mut w, t0, 1, 30, vec![mb, d2.clone()]);
    assert_eq!(
        notices,
        vec![
            n(WatchNotice::Left(a)),
            n(WatchNotice::Left(b)),
            n(WatchNotice::Down(c)),
            n(WatchNotice::Down(d)),
            n(WatchNotice::Up(d2.clone())),
            watch_cmd(3, 31),
        ]
    );
    // A host whose marker was seen, then left and registered again while
    // disconnected: `Left` then `Up`.
    w.handle(t0, ok(RpcId(3), Response::WatchEvents { events: vec![] }));
    let events = vec![put(on(8, kv(&marker(4), "", 31, 31)))];
    w.handle(t0, ok(RpcId(3), Response::WatchEvents { events }));
    let d3 = on(9, kv(&host(4), "d3", 40, 40));
    let notices = resync_to(&mut w, t0, 3, 41, vec![d3.clone()]);
    assert_eq!(
        notices,
        vec![
            n(WatchNotice::Left(d2)),
            n(WatchNotice::Up(d3.clone())),
            watch_cmd(5, 42),
        ]
    );
    // d3 left in one transaction while disconnected, its revoke not yet
    // applied: the fresh snapshot's marker, never seen live, says so. A
    // marker on another lease says nothing.
    let e = on(9, kv(&host(5), "e", 43, 43));
    let events = vec![put(e.clone())];
    w.handle(t0, ok(RpcId(5), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Up(e.clone()))]);
    let fresh = vec![
        on(9, kv(&marker(4), "", 50, 50)),
        on(77, kv(&marker(5), "", 51, 51)),
    ];
    let notices = resync_to(&mut w, t0, 5, 52, fresh);
    assert_eq!(
        notices,
        vec![
            n(WatchNotice::Left(d3)),
            n(WatchNotice::Down(e)),
            watch_cmd(7, 53),
        ]
    );
}

#[test]
fn a_first_page_in_key_order_is_known_whole_whether_or_not_it_holds_markers() {
    // All entries: the set is built from the page in one go.
    let t0 = start();
    let kvs: Vec<KeyValue> = (1..=40).map(|i| kv(&host(i), "v", 3, 3)).collect();
    let w = live_with(t0, kvs.clone());
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), kvs);

    // A leave marker between the entries (still key order): one by one,
    // the marker kept aside and never told.
    let mut w = Watch::new(config(), t0, 1);
    assert_eq!(drain(&mut w), vec![range_cmd(0)]);
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    let mut marker_key = host(1);
    marker_key.extend_from_slice(LEAVE_MARKER_SUFFIX);
    let marker = kv(&marker_key, "", 5, 5);
    w.handle(t0, page(0, 10, vec![a.clone(), marker, b.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(a.clone())),
            n(WatchNotice::Up(b.clone())),
            n(WatchNotice::Synced),
            watch_cmd(1, 11),
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a, b]);
}

// ---- Incarnations: `<host>/incarnation`, joined to the host key written
// in the same revision on the same lease, told before each notice.

fn incarnation(n: u32) -> Vec<u8> {
    incarnation_key(&host(n))
}

/// `n`'s incarnation key written with `entry`'s state (same revision,
/// same lease).
fn inc_of(entry: &KeyValue, value: &str) -> KeyValue {
    KeyValue {
        key: incarnation_key(&entry.key),
        value: value.as_bytes().to_vec(),
        ..entry.clone()
    }
}

fn i(incarnation: u64) -> Command<WatchNotice> {
    n(WatchNotice::Incarnation(incarnation))
}

#[test]
fn a_snapshot_joins_each_host_to_the_incarnation_written_with_it() {
    let t0 = start();
    let mut w = Watch::new(config(), t0, 1);
    drain(&mut w);
    let (a, b, c, d) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 6),
        kv(&host(3), "c", 5, 5),
        kv(&host(4), "d", 7, 7),
    );
    let snapshot = vec![
        a.clone(),
        inc_of(&a, "1"),
        // Written alone, after the host key: not the host's.
        b.clone(),
        KeyValue {
            mod_revision: 8,
            ..inc_of(&b, "5")
        },
        // On another lease.
        c.clone(),
        KeyValue {
            lease: 99,
            ..inc_of(&c, "2")
        },
        // Not a positive decimal number.
        d.clone(),
        inc_of(&d, "+3"),
        // An incarnation key without its host: nothing.
        kv(&incarnation(5), "4", 9, 9),
    ];
    w.handle(t0, page(0, 10, snapshot));
    assert_eq!(
        drain(&mut w),
        vec![
            i(1),
            n(WatchNotice::Up(a.clone())),
            n(WatchNotice::Up(b.clone())),
            n(WatchNotice::Up(c.clone())),
            n(WatchNotice::Up(d.clone())),
            n(WatchNotice::Synced),
            watch_cmd(1, 11),
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a, b, c, d]);
}

/// Key order puts a host's incarnation key right after it, so a page may
/// end between them: the page's lookahead key settles it at once; a
/// one-key page (no lookahead) holds the host's `Up` for the next page;
/// the snapshot's end tells a host whose incarnation key never came.
#[test]
fn a_host_whose_incarnation_key_opens_the_next_page_is_told_with_it() {
    let t0 = start();
    let mut w = Watch::new(paged(2), t0, 1);
    drain(&mut w);
    let (a, b, c) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 4),
        kv(&host(3), "c", 5, 5),
    );
    // [a, a/incarnation] + lookahead b.
    w.handle(t0, page(0, 10, vec![a.clone(), inc_of(&a, "2"), b.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(1, 2, Some(&incarnation(1)), 10),
            i(2),
            n(WatchNotice::Up(a.clone())),
        ]
    );
    // [b, b/incarnation] + lookahead... none needed: the lookahead is b's
    // incarnation key in the next case; here [b, c] + lookahead c/inc.
    w.handle(t0, page(1, 10, vec![b.clone(), c.clone(), inc_of(&c, "7")]));
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(2, 2, Some(&host(3)), 10),
            n(WatchNotice::Up(b.clone())),
            i(7),
            n(WatchNotice::Up(c.clone())),
        ]
    );
    // The next page repeats the lookahead key: nothing is held for it.
    w.handle(t0, page(2, 10, vec![inc_of(&c, "7")]));
    assert_eq!(
        drain(&mut w),
        vec![n(WatchNotice::Synced), watch_cmd(3, 11)]
    );

    // One-key pages have no lookahead.
    let mut w = Watch::new(paged(1), t0, 1);
    drain(&mut w);
    w.handle(t0, page(0, 10, vec![a.clone()]));
    assert_eq!(drain(&mut w), vec![page_cmd(1, 1, Some(&host(1)), 10)]);
    w.handle(t0, page(1, 10, vec![inc_of(&a, "3")]));
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(2, 1, Some(&incarnation(1)), 10),
            i(3),
            n(WatchNotice::Up(a.clone())),
        ]
    );
    w.handle(t0, page(2, 10, vec![b.clone()]));
    assert_eq!(drain(&mut w), vec![page_cmd(3, 1, Some(&host(2)), 10)]);
    // A key past b's incarnation key tells b without one.
    w.handle(t0, page(3, 10, vec![c.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![page_cmd(4, 1, Some(&host(3)), 10), n(WatchNotice::Up(b))]
    );
    // The last page (empty) ends the snapshot: c is told without one.
    w.handle(t0, page(4, 10, vec![]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(c)),
            n(WatchNotice::Synced),
            watch_cmd(5, 11)
        ]
    );
}

/// A held host was never told: a snapshot restarted (compaction between
/// pages) finds it as new, in the diff.
#[test]
fn a_held_host_is_found_again_by_a_restarted_snapshot() {
    let t0 = start();
    let mut w = Watch::new(paged(1), t0, 1);
    drain(&mut w);
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    w.handle(t0, page(0, 10, vec![a.clone()]));
    w.handle(t0, page(1, 10, vec![inc_of(&a, "1")]));
    w.handle(t0, page(2, 10, vec![b.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(1, 1, Some(&host(1)), 10),
            page_cmd(2, 1, Some(&incarnation(1)), 10),
            i(1),
            n(WatchNotice::Up(a.clone())),
            page_cmd(3, 1, Some(&host(2)), 10),
        ]
    );
    w.handle(
        t0,
        refused(
            3,
            RpcError::Compacted {
                compact_revision: 12,
            },
        ),
    );
    assert_eq!(drain(&mut w), vec![page_cmd(4, 1, None, 0)]);
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a.clone()]);
    // The consumer has a: the restarted snapshot is collected, then diffed.
    let pages = [a.clone(), inc_of(&a, "1"), b.clone(), inc_of(&b, "5")];
    for (k, kv) in pages.into_iter().enumerate() {
        let id = 4 + k as u64;
        w.handle(t0, page(id, 15, vec![kv.clone()]));
        assert_eq!(drain(&mut w), vec![page_cmd(id + 1, 1, Some(&kv.key), 15)]);
    }
    w.handle(t0, page(8, 15, vec![]));
    assert_eq!(
        drain(&mut w),
        vec![
            i(5),
            n(WatchNotice::Up(b.clone())),
            n(WatchNotice::Synced),
            watch_cmd(9, 16)
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![a, b]);
}

/// A first snapshot restarted before anything was told streams again:
/// a host held from the given-up revision and gone at the new one is
/// never told.
#[test]
fn a_held_host_gone_by_the_restarted_snapshot_is_never_told() {
    let t0 = start();
    let mut w = Watch::new(paged(1), t0, 1);
    drain(&mut w);
    let (a, b) = (kv(&host(1), "a", 3, 3), kv(&host(2), "b", 4, 4));
    w.handle(t0, page(0, 10, vec![a]));
    assert_eq!(drain(&mut w), vec![page_cmd(1, 1, Some(&host(1)), 10)]);
    w.handle(
        t0,
        refused(
            1,
            RpcError::Compacted {
                compact_revision: 12,
            },
        ),
    );
    assert_eq!(drain(&mut w), vec![page_cmd(2, 1, None, 0)]);
    w.handle(t0, page(2, 15, vec![b.clone()]));
    assert_eq!(drain(&mut w), vec![page_cmd(3, 1, Some(&host(2)), 15)]);
    w.handle(t0, page(3, 15, vec![]));
    assert_eq!(
        drain(&mut w),
        vec![
            n(WatchNotice::Up(b.clone())),
            n(WatchNotice::Synced),
            watch_cmd(4, 16)
        ]
    );
    assert_eq!(w.known().cloned().collect::<Vec<_>>(), vec![b]);
}

#[test]
fn live_puts_carry_the_incarnation_written_in_their_revision_in_either_order() {
    let t0 = start();
    let a = kv(&host(1), "a", 3, 3);
    let mut w = live_with(t0, vec![a.clone(), inc_of(&a, "1")]);
    // A resume's transaction: the incarnation key first, then the host key.
    let a2 = kv(&host(1), "a2", 3, 11);
    let events = vec![put(inc_of(&a2, "2")), put(a2.clone())];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(
        drain(&mut w),
        vec![i(2), n(WatchNotice::Updated(a2.clone()))]
    );
    // The other order, for a new host.
    let b = kv(&host(2), "b", 12, 12);
    let events = vec![put(b.clone()), put(inc_of(&b, "1"))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![i(1), n(WatchNotice::Up(b.clone()))]);
    // An incarnation key written or deleted alone tells nothing and
    // changes nothing.
    let events = vec![put(kv(&incarnation(1), "9", 3, 13))];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    let events = vec![del(&incarnation(2), 14)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![]);
    // The host key written without its incarnation key (another client):
    // no incarnation.
    let a3 = kv(&host(1), "a3", 3, 15);
    w.handle(
        t0,
        ok(
            RpcId(1),
            Response::WatchEvents {
                events: vec![put(a3.clone())],
            },
        ),
    );
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Updated(a3.clone()))]);
    // A leave (marker put, host key and incarnation key deleted in one
    // transaction) and an expiry carry the last incarnation told.
    let marker = KeyValue {
        key: leave_marker_key(&host(2)),
        value: vec![],
        create_revision: 16,
        mod_revision: 16,
        version: 1,
        lease: 7,
    };
    let events = vec![put(marker), del(&host(2), 16), del(&incarnation(2), 16)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![i(1), n(WatchNotice::Left(b))]);
    let events = vec![del(&host(1), 17), del(&incarnation(1), 17)];
    w.handle(t0, ok(RpcId(1), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![n(WatchNotice::Down(a3))]);
}

#[test]
fn a_resync_joins_new_and_changed_hosts_and_keeps_unchanged_ones() {
    let t0 = start();
    let (a, b, c) = (
        kv(&host(1), "a", 3, 3),
        kv(&host(2), "b", 4, 4),
        kv(&host(3), "c", 5, 5),
    );
    let mut w = live_with(
        t0,
        vec![
            a.clone(),
            inc_of(&a, "1"),
            b.clone(),
            inc_of(&b, "4"),
            c.clone(),
            inc_of(&c, "2"),
        ],
    );
    // While no watch was open: a resumed (incarnation 2), b's incarnation
    // key rewritten alone, c expired, d registered.
    let a2 = kv(&host(1), "a2", 3, 12);
    let d = kv(&host(4), "d", 13, 13);
    let kvs = vec![
        a2.clone(),
        inc_of(&a2, "2"),
        b.clone(),
        kv(&incarnation(2), "9", 4, 14),
        d.clone(),
        inc_of(&d, "1"),
    ];
    assert_eq!(
        resync_to(&mut w, t0, 1, 15, kvs),
        vec![
            i(2),
            n(WatchNotice::Updated(a2)),
            i(2),
            n(WatchNotice::Down(c)),
            i(1),
            n(WatchNotice::Up(d)),
            watch_cmd(3, 16),
        ]
    );
    // b kept incarnation 4: its expiry says so.
    let events = vec![del(&host(2), 17)];
    w.handle(t0, ok(RpcId(3), Response::WatchEvents { events }));
    assert_eq!(drain(&mut w), vec![i(4), n(WatchNotice::Down(b))]);
}

/// Only host keys have incarnations: under `KeyRule::Any` a key ending in
/// `/incarnation` is an entry like any other, and nothing is held.
#[test]
fn without_host_ids_an_incarnation_key_is_an_ordinary_key() {
    let t0 = start();
    let mut w = Watch::new(
        WatchConfig {
            keys: KeyRule::Any,
            ..paged(1)
        },
        t0,
        1,
    );
    drain(&mut w);
    let a = kv(&host(1), "a", 3, 3);
    w.handle(t0, page(0, 10, vec![a.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![page_cmd(1, 1, Some(&host(1)), 10), n(WatchNotice::Up(a))]
    );
    let inc = kv(&incarnation(1), "1", 3, 3);
    w.handle(t0, page(1, 10, vec![inc.clone()]));
    assert_eq!(
        drain(&mut w),
        vec![
            page_cmd(2, 1, Some(&incarnation(1)), 10),
            n(WatchNotice::Up(inc))
        ]
    );
}

/// Answers every snapshot page of `w` from `store` (sorted keys) as etcd
/// would, until the watch is asked for; returns each page's range and how
/// many stored keys lay in it from its start (what etcd counts for that
/// page), and the notices.
fn serve_snapshot(
    w: &mut Watch,
    t0: Instant,
    store: &[KeyValue],
) -> (Vec<(KeyRange, usize)>, Vec<WatchNotice>) {
    let (mut pages, mut notices) = (Vec::new(), Vec::new());
    let mut queue = drain(w);
    while let Some(command) = queue.first().cloned() {
        queue.remove(0);
        match command {
            Command::Rpc {
                id,
                request: Request::Range(r),
            } => {
                let inside: Vec<KeyValue> = store
                    .iter()
                    .filter(|kv| r.range.contains(&kv.key))
                    .cloned()
                    .collect();
                pages.push((r.range.clone(), inside.len()));
                let limit = usize::try_from(r.limit).unwrap();
                let kvs = inside.into_iter().take(limit).collect();
                w.handle(t0, page(id.0, 10, kvs));
                queue.extend(drain(w));
            }
            Command::Rpc {
                request: Request::Watch { .. },
                ..
            } => break,
            Command::Notify(notice) => notices.push(notice),
            other => panic!("unexpected {other:?}"),
        }
    }
    (pages, notices)
}

/// A big prefix is read with each page's range bounded after the first
/// pages, so that what etcd counts per page (the rest of the page's range)
/// stays near the page size instead of the rest of the prefix: linear in
/// the prefix, not quadratic. Every key is still told once, in order, at
/// one revision, and `Synced` comes after the last.
#[test]
fn a_big_snapshot_bounds_each_pages_range_and_still_tells_every_key() {
    let t0 = start();
    let page_size = 10;
    let mut w = Watch::new(paged(page_size), t0, 1);
    // 2,000 hosts spread over the id space like random ids.
    let store: Vec<KeyValue> = (0..2000u64)
        .map(|i| {
            let id = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let key = format!(
                "/h/{:08x}-0000-4000-8000-{:012x}",
                id >> 32,
                id & 0xffff_ffff_ffff
            );
            kv(key.as_bytes(), "m", 3, 3)
        })
        .collect();
    let store: Vec<KeyValue> = {
        let mut s = store;
        s.sort_by(|a, b| a.key.cmp(&b.key));
        s.dedup_by(|a, b| a.key == b.key);
        s
    };
    let (pages, notices) = serve_snapshot(&mut w, t0, &store);
    let told: Vec<Vec<u8>> = notices
        .iter()
        .filter_map(|n| match n {
            WatchNotice::Up(kv) => Some(kv.key.clone()),
            _ => None,
        })
        .collect();
    let all: Vec<Vec<u8>> = store.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(told, all, "every key, once, in order");
    assert_eq!(notices.last(), Some(&WatchNotice::Synced));
    // What etcd counts over the whole read: the prefix a few times over
    // (about 8 here), where pages that all run to the prefix's end count
    // it 100 times over (2,000 keys in pages of 10).
    let counted: usize = pages.iter().map(|(_, n)| n).sum();

    assert!(
        counted < 10 * store.len(),
        "{counted} keys counted over {} pages for {} keys",
        pages.len(),
        store.len()
    );
    assert!(pages.len() < 2 * store.len() / usize::try_from(page_size).unwrap() + 20);
    let spans = pages
        .iter()
        .filter(|(r, _)| matches!(r, KeyRange::PrefixSpan { .. }))
        .count();
    assert!(spans > pages.len() / 2, "{spans} of {} pages", pages.len());
}
