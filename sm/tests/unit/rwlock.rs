//! Exact command sequences of the election protocol as a read-write lock
//! ([`ElectionConfig::rw`]): the keys of Go's `recipes.RWMutex`, what a
//! reader and a writer read and watch, and when each holds.

use crate::election_support::*;
use crate::support::{delete_event, drain};
use fleetcoord_sm::election::*;
use fleetcoord_sm::rpc::{
    KeyRange, RangeRequest, Request, Response, SortOrder, Txn, TxnOp, TxnOpResponse, WatchEvent,
};
use fleetcoord_sm::*;
use std::time::Instant;

/// The lock's root, `<prefix><name>/`.
const ROOT: &[u8] = b"/r/db/";

fn config(rw: RwRole) -> ElectionConfig {
    ElectionConfig {
        rw: Some(rw),
        ..election_config(ROOT, 1)
    }
}

fn registered(t0: Instant, rw: RwRole) -> Election {
    registered_with(config(rw), t0)
}

fn read_key() -> Vec<u8> {
    lease_key(b"/r/db/read/")
}

fn write_key() -> Vec<u8> {
    lease_key(b"/r/db/write/")
}

fn key_of(rw: RwRole) -> Vec<u8> {
    match rw {
        RwRole::Read => read_key(),
        RwRole::Write => write_key(),
    }
}

/// What blocks `rw`: writers only for a reader, every key for a writer.
fn queue_of(rw: RwRole) -> &'static [u8] {
    match rw {
        RwRole::Read => b"/r/db/write/",
        RwRole::Write => ROOT,
    }
}

fn range(queue: &[u8], limit: i64, sort: SortOrder, max_create_revision: Revision) -> TxnOp {
    TxnOp::Range(RangeRequest {
        range: KeyRange::Prefix(queue.to_vec()),
        sort,
        limit,
        max_create_revision,
        revision: 0,
        keys_only: true,
    })
}

/// The join of `rw`: create my key under its directory and read the
/// newest three keys of its queue, or, if it was there, my key and the
/// queue's oldest.
fn create_txn(rw: RwRole) -> Request {
    create_key(
        &key_of(rw),
        b"",
        range(queue_of(rw), 3, SortOrder::CreateDescending, 0),
        range(queue_of(rw), 1, SortOrder::CreateAscending, 0),
    )
}

/// The try-join of `rw`: the same create, reading the queue's oldest key
/// with its value (named as the holder when it blocks).
fn try_create_txn(rw: RwRole) -> Request {
    let oldest = TxnOp::Range(RangeRequest {
        range: KeyRange::Prefix(queue_of(rw).to_vec()),
        sort: SortOrder::CreateAscending,
        limit: 1,
        max_create_revision: 0,
        revision: 0,
        keys_only: false,
    });
    create_key(&key_of(rw), b"", oldest.clone(), oldest)
}

/// The newest two keys of `rw`'s queue created before `token`, and my key.
fn older(rw: RwRole, token: Revision) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![
            range(queue_of(rw), 2, SortOrder::CreateDescending, token - 1),
            TxnOp::Range(RangeRequest::all(KeyRange::Key(key_of(rw)))),
        ],
        failure: vec![],
    })
}

/// The answer to a create of `rw`'s key at `revision` whose queue read
/// found `queue` (newest first). A reader's own key is not in its queue.
fn created(rw: RwRole, revision: Revision, queue: Vec<KeyValue>) -> Response {
    match rw {
        RwRole::Write => created_as(kv(&write_key(), b"", revision), queue),
        RwRole::Read => txn(
            revision,
            true,
            vec![TxnOpResponse::Put, TxnOpResponse::Range { kvs: queue }],
        ),
    }
}

fn elected(rw: RwRole, token: Revision, until: Instant, waited: bool) -> Command<ElectionNotice> {
    note(ElectionNotice::Elected {
        op: OpId(1),
        key: key_of(rw),
        token,
        lease: LEASE,
        waited,
        attempts: 1,
        trusted_until: until,
    })
}

fn campaign(e: &mut Election, t0: Instant, rw: RwRole) {
    e.handle(
        t0,
        ElectionInput::Campaign {
            op: OpId(1),
            value: Vec::new(),
        },
    );
    assert_eq!(drain(e), vec![rpc(P, create_txn(rw))]);
}

fn watch_root(start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(ROOT.to_vec()),
        start_revision,
    }
}

fn events(events: Vec<WatchEvent>) -> Response {
    Response::WatchEvents { events }
}

#[test]
fn keys_are_those_of_go_recipes_rwmutex() {
    let t0 = Instant::now();
    for rw in [RwRole::Read, RwRole::Write] {
        let e = registered(t0, rw);
        assert_eq!(e.my_key(), Some(key_of(rw)));
    }
    assert_eq!(read_key(), b"/r/db/read/2a1f".to_vec());
    assert_eq!(write_key(), b"/r/db/write/2a1f".to_vec());
}

/// Rule: a reader waits for writers only. Readers older than it are not
/// even read (its queue is `<root>write/`), so with no writer it holds
/// on the create's answer, however many readers hold.
#[test]
fn a_reader_with_no_writer_holds_on_the_create_answer() {
    let t0 = Instant::now();
    let mut e = registered(t0, RwRole::Read);
    campaign(&mut e, t0, RwRole::Read);
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(&mut e, t0, P, created(RwRole::Read, 7, vec![])),
        vec![
            elected(RwRole::Read, 7, until, false),
            rpc(P + 1, watch(&read_key(), 8))
        ]
    );
    assert!(e.is_leader());
}

/// Rule: a reader behind one writer (the read was short, so that writer
/// is all that is ahead) watches the whole root, where its own key lies
/// too, and holds at the writer's delete when nothing touched its key
/// before it; another reader's delete changes nothing.
#[test]
fn a_reader_behind_one_writer_holds_at_its_delete() {
    let t0 = Instant::now();
    let mut e = registered(t0, RwRole::Read);
    campaign(&mut e, t0, RwRole::Read);
    let w = kv(b"/r/db/write/99", b"", 5);
    assert_eq!(
        ok(&mut e, t0, P, created(RwRole::Read, 7, vec![w])),
        vec![rpc(P + 1, watch_root(8))]
    );
    assert!(!e.is_leader());
    let other_reader = delete_event(b"/r/db/read/77".to_vec(), 8);
    assert_eq!(ok(&mut e, t0, P + 1, events(vec![other_reader])), vec![]);
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            events(vec![delete_event(b"/r/db/write/99".to_vec(), 9)])
        ),
        vec![
            cancel(P + 1),
            elected(RwRole::Read, 7, until, true),
            rpc(P + 2, watch(&read_key(), 10))
        ]
    );
}

/// A reader whose own key went (its lease expired, say) before the
/// writer's delete never claims: it reads again, and queues again.
#[test]
fn a_reader_whose_key_went_while_waiting_reads_again() {
    let t0 = Instant::now();
    let mut e = registered(t0, RwRole::Read);
    campaign(&mut e, t0, RwRole::Read);
    let w = kv(b"/r/db/write/99", b"", 5);
    ok(&mut e, t0, P, created(RwRole::Read, 7, vec![w]));
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            events(vec![
                delete_event(read_key(), 8),
                delete_event(b"/r/db/write/99".to_vec(), 9)
            ])
        ),
        vec![cancel(P + 1), rpc(P + 2, older(RwRole::Read, 7))]
    );
    assert!(!e.is_leader());
}

/// With three writers ahead (a full read), a reader watches only the
/// newest of them and, at its delete, reads the writers older than its
/// token again rather than trusting the rest are gone.
#[test]
fn a_reader_behind_many_writers_watches_the_newest_and_reads_again() {
    let t0 = Instant::now();
    let mut e = registered(t0, RwRole::Read);
    campaign(&mut e, t0, RwRole::Read);
    let ws = vec![
        kv(b"/r/db/write/c", b"", 6),
        kv(b"/r/db/write/b", b"", 5),
        kv(b"/r/db/write/a", b"", 4),
    ];
    assert_eq!(
        ok(&mut e, t0, P, created(RwRole::Read, 7, ws)),
        vec![rpc(P + 1, watch(b"/r/db/write/c", 8))]
    );
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            events(vec![delete_event(b"/r/db/write/c".to_vec(), 9)])
        ),
        vec![cancel(P + 1), rpc(P + 2, older(RwRole::Read, 7))]
    );
    // The read shows no older writer (a newer one would not be returned:
    // its create revision is above the bound) and my key: hold.
    let until = e.session_deadline().unwrap();
    let answer = txn(
        10,
        true,
        vec![
            TxnOpResponse::Range { kvs: vec![] },
            TxnOpResponse::Range {
                kvs: vec![kv(&read_key(), b"", 7)],
            },
        ],
    );
    assert_eq!(
        ok(&mut e, t0, P + 2, answer),
        vec![
            elected(RwRole::Read, 7, until, true),
            rpc(P + 3, watch(&read_key(), 11))
        ]
    );
}

/// Rule: a writer waits for every older key, readers included.
#[test]
fn a_writer_waits_for_an_older_reader() {
    let t0 = Instant::now();
    let mut e = registered(t0, RwRole::Write);
    campaign(&mut e, t0, RwRole::Write);
    let r = kv(b"/r/db/read/55", b"", 5);
    assert_eq!(
        ok(&mut e, t0, P, created(RwRole::Write, 7, vec![r])),
        vec![rpc(P + 1, watch_root(8))]
    );
    assert!(!e.is_leader());
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(
            &mut e,
            t0,
            P + 1,
            events(vec![delete_event(b"/r/db/read/55".to_vec(), 9)])
        ),
        vec![
            cancel(P + 1),
            elected(RwRole::Write, 7, until, true),
            rpc(P + 2, watch(&write_key(), 10))
        ]
    );
}

/// A try-read holds when the oldest writer is newer than its key (it
/// queued behind the reader), and fails naming the writer when it is
/// older, leaving no key behind.
#[test]
fn a_try_read_looks_only_at_older_writers() {
    let t0 = Instant::now();
    let mut e = registered(t0, RwRole::Read);
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(1),
            value: Vec::new(),
        },
    );
    assert_eq!(drain(&mut e), vec![rpc(P, try_create_txn(RwRole::Read))]);
    let newer = kv(b"/r/db/write/99", b"", 9);
    let answer = txn(
        7,
        true,
        vec![
            TxnOpResponse::Put,
            TxnOpResponse::Range { kvs: vec![newer] },
        ],
    );
    let until = e.session_deadline().unwrap();
    assert_eq!(
        ok(&mut e, t0, P, answer),
        vec![
            elected(RwRole::Read, 7, until, false),
            rpc(P + 1, watch(&read_key(), 8))
        ]
    );

    let mut e = registered(t0, RwRole::Read);
    e.handle(
        t0,
        ElectionInput::TryCampaign {
            op: OpId(1),
            value: Vec::new(),
        },
    );
    drain(&mut e);
    let older_writer = kv(b"/r/db/write/99", b"", 5);
    let answer = txn(
        7,
        true,
        vec![
            TxnOpResponse::Put,
            TxnOpResponse::Range {
                kvs: vec![older_writer],
            },
        ],
    );
    assert_eq!(
        ok(&mut e, t0, P, answer),
        vec![rpc(P + 1, guarded_delete(&read_key(), 7))]
    );
    assert!(!e.is_leader());
}

/// Priorities and hand-overs order one leader among candidates of one
/// kind: a read-write lock refuses them, sending nothing.
#[test]
fn a_ranked_campaign_is_refused_by_a_rwlock() {
    let t0 = Instant::now();
    for rw in [RwRole::Read, RwRole::Write] {
        let mut e = registered(t0, rw);
        e.handle(
            t0,
            ElectionInput::CampaignRanked {
                op: OpId(1),
                value: Vec::new(),
                rank: Rank::default(),
            },
        );
        assert_eq!(
            drain(&mut e),
            vec![note(ElectionNotice::CampaignFailed {
                op: OpId(1),
                error: ElectionError::NotWithPermits,
            })]
        );
    }
}
