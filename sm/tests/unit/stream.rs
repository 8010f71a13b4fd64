//! Exact command sequences of the stream machines: the append's guarded
//! transaction, the head it keeps (so only the first append reads it),
//! backoff and failure outcomes; the reader's first read per
//! position, delivery rule, re-reads and stop.

use crate::support::{delete_event, drain, put_event};
use fleetcoord_sm::stream::requests;
use fleetcoord_sm::stream::*;
use fleetcoord_sm::*;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

const MS: Duration = Duration::from_millis(1);

fn keys() -> StreamKeys {
    StreamKeys::new("/c", "s")
}

/// No jitter, so every deadline is exact: 10 ms doubling up to 40 ms.
fn backoff() -> BackoffConfig {
    BackoffConfig {
        initial: Duration::from_millis(10),
        max: Duration::from_millis(40),
        multiplier: 2,
        jitter_percent: 0,
    }
}

fn append_config(max_len: Option<u64>, max_attempts: u32) -> AppendConfig {
    AppendConfig {
        max_len: max_len.and_then(NonZeroU64::new),
        backoff: backoff(),
        max_attempts,
        ..AppendConfig::new(keys())
    }
}

/// Tests need some instant to start from; the machines never read a clock.
fn start() -> Instant {
    Instant::now()
}

fn head(seq: &str, mod_revision: Revision) -> KeyValue {
    KeyValue {
        key: keys().head().to_vec(),
        value: seq.as_bytes().to_vec(),
        create_revision: 2,
        mod_revision,
        version: 1,
        lease: 0,
    }
}

fn entry(seq: u64, payload: &str, revision: Revision) -> KeyValue {
    KeyValue {
        key: keys().entry_key(seq),
        value: payload.as_bytes().to_vec(),
        create_revision: revision,
        mod_revision: revision,
        version: 1,
        lease: 0,
    }
}

fn reply<E: From<RpcReply>>(id: u64, result: Result<Response, RpcError>) -> E {
    RpcReply {
        id: RpcId(id),
        result,
    }
    .into()
}

fn ok<E: From<RpcReply>>(id: u64, response: Response) -> E {
    reply(id, Ok(response))
}

fn unavailable<E: From<RpcReply>>(id: u64) -> E {
    reply(id, Err(RpcError::Unavailable("gone".into())))
}

fn range(revision: Revision, kvs: Vec<KeyValue>) -> Response {
    Response::Range { revision, kvs }
}

fn txn(succeeded: bool) -> Response {
    Response::Txn {
        revision: 50,
        succeeded,
        responses: vec![],
    }
}

/// A lost race's answer: the failure branch read the head `seq` written
/// at `mod_revision`.
fn lost_to(seq: &str, mod_revision: Revision) -> Response {
    Response::Txn {
        revision: mod_revision,
        succeeded: false,
        responses: vec![TxnOpResponse::Range {
            kvs: vec![head(seq, mod_revision)],
        }],
    }
}

fn rpc<N>(id: u64, request: Request) -> Command<N> {
    Command::Rpc {
        id: RpcId(id),
        request,
    }
}

fn read_head_cmd<N>(id: u64) -> Command<N> {
    rpc(
        id,
        Request::Range(RangeRequest::all(KeyRange::Key(
            b"/c/stream/s/head".to_vec(),
        ))),
    )
}

/// The append guard: the head's mod revision, and for a head that exists
/// its value as well (a pair etcd never held must not write).
fn head_guard(revision: Revision, seq: u64) -> Vec<Compare> {
    let mut guard = vec![Compare::ModRevisionEquals {
        key: b"/c/stream/s/head".to_vec(),
        revision,
    }];
    if revision != 0 {
        guard.push(Compare::ValueEquals {
            key: b"/c/stream/s/head".to_vec(),
            value: seq.to_string().into_bytes(),
        });
    }
    guard
}

/// The append transaction, spelled out once by hand: everything else is
/// compared against it.
fn append_cmd(
    id: u64,
    guard: Revision,
    seq: u64,
    payload: &str,
    trim: Option<u64>,
) -> Command<AppendNotice> {
    let mut success = vec![
        TxnOp::Put {
            key: b"/c/stream/s/head".to_vec(),
            value: seq.to_string().into_bytes(),
            lease: 0,
        },
        TxnOp::Put {
            key: format!("/c/stream/s/e/{seq:020}").into_bytes(),
            value: payload.as_bytes().to_vec(),
            lease: 0,
        },
    ];
    if let Some(gone) = trim {
        success.push(TxnOp::Delete(KeyRange::Key(
            format!("/c/stream/s/e/{gone:020}").into_bytes(),
        )));
    }
    rpc(
        id,
        Request::Txn(Txn {
            compare: head_guard(guard, seq - 1),
            success,
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
                b"/c/stream/s/head".to_vec(),
            )))],
        }),
    )
}

/// [`append_cmd`] as resent after a lost answer: the same guard and
/// writes; the failure branch reads entry `seq` too.
fn resend_cmd(
    id: u64,
    guard: Revision,
    seq: u64,
    payload: &str,
    trim: Option<u64>,
) -> Command<AppendNotice> {
    let Command::Rpc {
        id,
        request: Request::Txn(mut txn),
    } = append_cmd(id, guard, seq, payload, trim)
    else {
        unreachable!("append_cmd builds a transaction")
    };
    txn.failure
        .push(TxnOp::Range(RangeRequest::all(KeyRange::Key(
            format!("/c/stream/s/e/{seq:020}").into_bytes(),
        ))));
    Command::Rpc {
        id,
        request: Request::Txn(txn),
    }
}

/// Appended by a transaction answered with [`txn`]`(true)` (revision 50).
fn appended(seq: u64) -> Command<AppendNotice> {
    Command::Notify(AppendNotice::Appended { seq, revision: 50 })
}

fn failed(error: StreamError) -> Command<AppendNotice> {
    Command::Notify(AppendNotice::Failed(error))
}

#[test]
fn the_first_append_guards_on_the_absent_head_and_writes_entry_one() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    assert!(drain(&mut a).is_empty(), "idle until asked");
    assert_eq!(a.poll_timeout(), None);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    assert_eq!(drain(&mut a), vec![read_head_cmd(0)]);
    a.handle(t0, ok(0, range(1, vec![])));
    assert_eq!(drain(&mut a), vec![append_cmd(1, 0, 1, "x", None)]);
    a.handle(t0 + MS, ok(1, txn(true)));
    assert_eq!(drain(&mut a), vec![appended(1)]);
    assert_eq!((a.pending(), a.poll_timeout()), (0, None));
}

#[test]
fn trimming_deletes_exactly_the_entry_that_falls_out() {
    let t0 = start();
    // seq 3 with max 3: nothing falls out yet; seq 4: entry 1 does.
    for (at, guard, seq, trim) in [
        ("2", 7, 3, None),
        ("3", 8, 4, Some(1)),
        ("9", 20, 10, Some(7)),
    ] {
        let mut a = Append::new(append_config(Some(3), 5), t0, 1);
        a.handle(t0, AppendInput::Append(b"p".to_vec()));
        let read = drain(&mut a);
        let Some(Command::Rpc { id, .. }) = read.first() else {
            panic!("{read:?}")
        };
        let id = id.0;
        a.handle(t0, ok(id, range(guard, vec![head(at, guard)])));
        assert_eq!(
            drain(&mut a),
            vec![append_cmd(id + 1, guard, seq, "p", trim)]
        );
        a.handle(t0, ok(id + 1, txn(true)));
        assert_eq!(drain(&mut a), vec![appended(seq)]);
    }
}

#[test]
fn a_lost_race_waits_the_backoff_then_retries_on_the_head_it_lost_to() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, range(4, vec![head("3", 4)])));
    assert_eq!(
        drain(&mut a),
        vec![read_head_cmd(0), append_cmd(1, 4, 4, "x", None)]
    );
    a.handle(t0 + MS, ok(1, lost_to("5", 6)));
    assert!(drain(&mut a).is_empty(), "no busy retry");
    assert_eq!(a.poll_timeout(), Some(t0 + 11 * MS));
    a.handle_timeout(t0 + 10 * MS);
    assert!(drain(&mut a).is_empty(), "early timeouts do nothing");
    a.handle_timeout(t0 + 11 * MS);
    assert_eq!(
        drain(&mut a),
        vec![append_cmd(2, 6, 6, "x", None)],
        "no read: the answer showed the head"
    );
    assert_eq!(a.poll_timeout(), None);
    a.handle(t0 + 13 * MS, ok(2, txn(true)));
    assert_eq!(drain(&mut a), vec![appended(6)]);
}

#[test]
fn a_lost_race_whose_answer_lacks_the_head_reads_it_after_the_backoff() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, range(4, vec![head("3", 4)])));
    a.handle(t0 + MS, ok(1, txn(false)));
    a.handle_timeout(t0 + 11 * MS);
    a.handle(t0 + 12 * MS, ok(2, range(6, vec![head("5", 6)])));
    a.handle(t0 + 13 * MS, ok(3, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![
            read_head_cmd(0),
            append_cmd(1, 4, 4, "x", None),
            read_head_cmd(2),
            append_cmd(3, 6, 6, "x", None),
            appended(6)
        ]
    );
}

#[test]
fn a_given_head_saves_the_read_and_a_stale_one_costs_one_attempt_without_backoff() {
    let t0 = start();
    let given = |seq, mod_revision| AppendConfig {
        head: Some(Head { seq, mod_revision }),
        ..append_config(None, 5)
    };
    // Current: one round trip.
    let mut a = Append::new(given(5, 6), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![append_cmd(0, 6, 6, "x", None), appended(6)]
    );
    // Stale: the failure shows the head, the retry goes at once and the
    // failure is not counted as a lost race.
    let mut a = Append::new(
        AppendConfig {
            max_attempts: 1,
            ..given(5, 6)
        },
        t0,
        1,
    );
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, lost_to("9", 12)));
    assert_eq!(a.poll_timeout(), None, "no backoff");
    a.handle(t0, ok(1, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![
            append_cmd(0, 6, 6, "x", None),
            append_cmd(1, 12, 10, "x", None),
            appended(10)
        ]
    );
    // A real race after that is one: with one attempt allowed, contended.
    let mut a = Append::new(
        AppendConfig {
            max_attempts: 1,
            ..given(5, 6)
        },
        t0,
        1,
    );
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, lost_to("9", 12)));
    a.handle(t0, ok(1, lost_to("10", 13)));
    assert_eq!(
        drain(&mut a),
        vec![
            append_cmd(0, 6, 6, "x", None),
            append_cmd(1, 12, 10, "x", None),
            failed(StreamError::Contended { attempts: 1 })
        ]
    );
    // A garbage head in the failure fails the append without writing.
    let mut a = Append::new(given(5, 6), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, lost_to("x1", 12)));
    assert_eq!(
        drain(&mut a),
        vec![
            append_cmd(0, 6, 6, "x", None),
            failed(StreamError::BadHead {
                value: b"x1".to_vec()
            })
        ]
    );
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn an_append_that_loses_every_race_is_contended_after_max_attempts() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 4), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    drain(&mut a);
    let mut now = t0;
    let mut deadlines = Vec::new();
    a.handle(now, ok(0, range(9, vec![head("8", 9)])));
    for attempt in 0..4u64 {
        // Each lost race shows a newer head; the next attempt uses it.
        let commit = attempt + 1;
        let guard = 9 + attempt as Revision;
        assert_eq!(
            drain(&mut a),
            vec![append_cmd(commit, guard, 9 + attempt, "x", None)]
        );
        let winner = (9 + attempt).to_string();
        a.handle(now, ok(commit, lost_to(&winner, guard + 1)));
        if attempt == 3 {
            break;
        }
        assert!(drain(&mut a).is_empty());
        let at = a.poll_timeout().expect("backoff timer");
        deadlines.push(at - now);
        now = at;
        a.handle_timeout(now);
    }
    assert_eq!(
        deadlines,
        vec![10 * MS, 20 * MS, 40 * MS],
        "doubling, capped"
    );
    assert_eq!(
        drain(&mut a),
        vec![failed(StreamError::Contended { attempts: 4 })]
    );
    assert_eq!(a.poll_timeout(), None);
    // The next append starts a fresh schedule, on the head last shown.
    a.handle(now, AppendInput::Append(b"y".to_vec()));
    assert_eq!(drain(&mut a), vec![append_cmd(5, 13, 13, "y", None)]);
    a.handle(now, ok(5, lost_to("13", 14)));
    a.handle(now, ok(6, lost_to("14", 15)));
    assert_eq!(a.poll_timeout(), Some(now + 10 * MS));
}

#[test]
fn no_retry_starts_beyond_the_patience() {
    let t0 = start();
    let config = AppendConfig {
        patience: 25 * MS,
        ..append_config(None, 5)
    };
    let mut a = Append::new(config, t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, range(9, vec![head("8", 9)])));
    a.handle(t0 + MS, ok(1, lost_to("9", 10)));
    assert_eq!(a.poll_timeout(), Some(t0 + 11 * MS), "within the patience");
    a.handle_timeout(t0 + 11 * MS);
    // The next retry would start at 12 + 20 ms, beyond 25 ms.
    a.handle(t0 + 12 * MS, ok(2, lost_to("10", 11)));
    assert_eq!(
        drain(&mut a),
        vec![
            read_head_cmd(0),
            append_cmd(1, 9, 9, "x", None),
            append_cmd(2, 10, 10, "x", None),
            failed(StreamError::Contended { attempts: 2 })
        ]
    );
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn a_garbage_or_exhausted_head_fails_the_append_without_writing() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, range(3, vec![head("12a", 3)])));
    assert_eq!(
        drain(&mut a),
        vec![
            read_head_cmd(0),
            failed(StreamError::BadHead {
                value: b"12a".to_vec()
            })
        ]
    );
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(1, range(3, vec![head("18446744073709551615", 3)])));
    assert_eq!(
        drain(&mut a),
        vec![read_head_cmd(1), failed(StreamError::Exhausted)]
    );
}

#[test]
fn failed_requests_fail_the_append_and_an_unanswered_txn_is_resent_unchanged() {
    let t0 = start();
    let gone = RpcError::Unavailable("gone".into());
    let refused = RpcError::Rejected("too large".into());
    let mut a = Append::new(append_config(None, 5), t0, 1);
    // A failed head read wrote nothing.
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, unavailable(0));
    assert_eq!(
        drain(&mut a),
        vec![read_head_cmd(0), failed(StreamError::Rpc(gone.clone()))]
    );
    // A transaction etcd refused was not applied.
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(1, range(3, vec![])));
    a.handle(t0, reply(2, Err(refused.clone())));
    assert_eq!(
        drain(&mut a),
        vec![
            read_head_cmd(1),
            append_cmd(2, 0, 1, "x", None),
            failed(StreamError::Rpc(refused))
        ]
    );
    // A transaction without an answer may have been applied: the same one
    // goes again after the backoff, reading the entry it would write too.
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(3, range(3, vec![])));
    a.handle(t0, unavailable(4));
    assert_eq!(
        drain(&mut a),
        vec![read_head_cmd(3), append_cmd(4, 0, 1, "x", None)]
    );
    assert_eq!(a.poll_timeout(), Some(t0 + 10 * MS));
    a.handle_timeout(t0 + 10 * MS);
    assert_eq!(drain(&mut a), vec![resend_cmd(5, 0, 1, "x", None)]);
    // Its guard held: the lost one had not applied, this one did.
    a.handle(t0 + 11 * MS, ok(5, txn(true)));
    assert_eq!(drain(&mut a), vec![appended(1)]);
    assert_eq!(a.poll_timeout(), None);
    assert!(gone.is_retryable());
}

/// The answer to a resend whose guard failed: the head `seq` at
/// `mod_revision`, and entry `entry_seq` as read (absent for `None`).
fn resend_lost_to(seq: &str, mod_revision: Revision, entry_kv: Option<KeyValue>) -> Response {
    Response::Txn {
        revision: mod_revision,
        succeeded: false,
        responses: vec![
            TxnOpResponse::Range {
                kvs: vec![head(seq, mod_revision)],
            },
            TxnOpResponse::Range {
                kvs: entry_kv.into_iter().collect(),
            },
        ],
    }
}

/// An append of "x" on head 3 (mod revision 4) whose transaction (id 1,
/// writing entry 4) got no answer, and whose resend (id 2) is out.
fn append_in_doubt(config: AppendConfig, t0: Instant) -> Append {
    // With trimming to `m`, writing entry 4 deletes entry 4 - m.
    let trim = config
        .max_len
        .and_then(|m| 4u64.checked_sub(m.get()))
        .filter(|gone| *gone > 0);
    let mut a = Append::new(config, t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, range(4, vec![head("3", 4)])));
    a.handle(t0 + MS, unavailable(1));
    a.handle_timeout(t0 + 11 * MS);
    assert_eq!(
        drain(&mut a),
        vec![
            read_head_cmd(0),
            append_cmd(1, 4, 4, "x", trim),
            resend_cmd(2, 4, 4, "x", trim)
        ]
    );
    a
}

#[test]
fn a_resend_that_finds_our_entry_reports_it_once_without_writing_again() {
    let t0 = start();
    let mut a = append_in_doubt(append_config(None, 5), t0);
    // The lost one applied at revision 5; someone appended after it (6).
    a.handle(
        t0 + 12 * MS,
        ok(2, resend_lost_to("5", 6, Some(entry(4, "x", 5)))),
    );
    assert_eq!(
        drain(&mut a),
        vec![Command::Notify(AppendNotice::Appended {
            seq: 4,
            revision: 5
        })]
    );
    assert_eq!(a.poll_timeout(), None);
    // The answer showed the current head: the next append trusts it.
    a.handle(t0 + 13 * MS, AppendInput::Append(b"y".to_vec()));
    assert_eq!(drain(&mut a), vec![append_cmd(3, 6, 6, "y", None)]);
}

#[test]
fn a_resend_that_finds_another_entry_retries_as_a_lost_race() {
    let t0 = start();
    let mut a = append_in_doubt(append_config(None, 5), t0);
    a.handle(
        t0 + 12 * MS,
        ok(2, resend_lost_to("4", 5, Some(entry(4, "other", 5)))),
    );
    assert!(drain(&mut a).is_empty(), "a lost race: back off first");
    // The schedule goes on: 10 ms after the lost answer, now 20 ms.
    assert_eq!(a.poll_timeout(), Some(t0 + 32 * MS));
    a.handle_timeout(t0 + 32 * MS);
    assert_eq!(
        drain(&mut a),
        vec![append_cmd(3, 5, 5, "x", None)],
        "an ordinary append on the head it lost to, no entry read"
    );
    a.handle(t0 + 33 * MS, ok(3, txn(true)));
    assert_eq!(drain(&mut a), vec![appended(5)]);

    // A head short of the entry proves no one wrote it either.
    let mut a = append_in_doubt(append_config(None, 5), t0);
    a.handle(t0 + 12 * MS, ok(2, resend_lost_to("3", 9, None)));
    assert!(drain(&mut a).is_empty());
    a.handle_timeout(t0 + 32 * MS);
    assert_eq!(drain(&mut a), vec![append_cmd(3, 9, 4, "x", None)]);
}

#[test]
fn a_resend_that_cannot_tell_fails_indeterminate_naming_the_sequence() {
    let t0 = start();
    let gone = RpcError::Unavailable("gone".into());
    // Entry 4 was trimmed away before the resend could read it.
    let mut a = append_in_doubt(append_config(Some(1), 5), t0);
    a.handle(t0 + 12 * MS, ok(2, resend_lost_to("6", 8, None)));
    assert_eq!(
        drain(&mut a),
        vec![failed(StreamError::Indeterminate {
            seq: 4,
            error: gone.clone()
        })]
    );
    // A resend refused for good settles nothing.
    let refused = RpcError::PermissionDenied("denied".into());
    let mut a = append_in_doubt(append_config(None, 5), t0);
    a.handle(t0 + 12 * MS, reply(2, Err(refused.clone())));
    assert_eq!(
        drain(&mut a),
        vec![failed(StreamError::Indeterminate {
            seq: 4,
            error: refused
        })]
    );
    // A garbled head with the entry missing: nothing tells either.
    let mut a = append_in_doubt(append_config(None, 5), t0);
    let garbled = Response::Txn {
        revision: 9,
        succeeded: false,
        responses: vec![
            TxnOpResponse::Range {
                kvs: vec![head("junk", 9)],
            },
            TxnOpResponse::Range { kvs: vec![] },
        ],
    };
    a.handle(t0 + 12 * MS, ok(2, garbled));
    assert_eq!(
        drain(&mut a),
        vec![failed(StreamError::Indeterminate {
            seq: 4,
            error: gone.clone()
        })]
    );
    // An answer without the two reads is no answer to a resend.
    let mut a = append_in_doubt(append_config(None, 5), t0);
    a.handle(t0 + 12 * MS, ok(2, lost_to("4", 5)));
    let commands = drain(&mut a);
    assert!(
        matches!(
            commands.as_slice(),
            [Command::Notify(AppendNotice::Failed(
                StreamError::Unexpected(_)
            ))]
        ),
        "{commands:?}"
    );
}

#[test]
fn resends_that_keep_failing_end_indeterminate_within_patience_and_attempts() {
    let t0 = start();
    let gone = RpcError::Unavailable("gone".into());
    // Patience: the third resend would start at 1 + 10 + 20 + 40 = 71 ms.
    let config = AppendConfig {
        patience: 60 * MS,
        ..append_config(None, 5)
    };
    let mut a = append_in_doubt(config, t0);
    a.handle(t0 + 12 * MS, unavailable(2));
    assert_eq!(a.poll_timeout(), Some(t0 + 32 * MS));
    a.handle_timeout(t0 + 32 * MS);
    a.handle(t0 + 33 * MS, unavailable(3));
    assert_eq!(
        drain(&mut a),
        vec![
            resend_cmd(3, 4, 4, "x", None),
            failed(StreamError::Indeterminate {
                seq: 4,
                error: gone.clone()
            })
        ]
    );
    assert_eq!(a.poll_timeout(), None);
    // Attempts: with max_attempts 2, the second lost resend is the last.
    let mut a = append_in_doubt(append_config(None, 2), t0);
    a.handle(t0 + 12 * MS, unavailable(2));
    a.handle_timeout(t0 + 32 * MS);
    a.handle(t0 + 33 * MS, unavailable(3));
    assert_eq!(
        drain(&mut a),
        vec![
            resend_cmd(3, 4, 4, "x", None),
            failed(StreamError::Indeterminate {
                seq: 4,
                error: gone
            })
        ]
    );
    // An expired token is refused, not lost: the resend goes again.
    let mut a = append_in_doubt(append_config(None, 5), t0);
    a.handle(
        t0 + 12 * MS,
        reply(2, Err(RpcError::Unauthenticated("token".into()))),
    );
    a.handle_timeout(t0 + 32 * MS);
    assert_eq!(drain(&mut a), vec![resend_cmd(3, 4, 4, "x", None)]);
}

#[test]
fn stop_while_waiting_to_resend_is_indeterminate() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, AppendInput::Append(b"y".to_vec()));
    a.handle(t0, ok(0, range(4, vec![head("3", 4)])));
    a.handle(t0 + MS, unavailable(1));
    drain(&mut a);
    assert!(a.poll_timeout().is_some());
    a.handle(t0 + 2 * MS, AppendInput::Stop);
    assert_eq!(
        drain(&mut a),
        vec![
            failed(StreamError::Indeterminate {
                seq: 4,
                error: RpcError::Unavailable("gone".into())
            }),
            // y went in the same transaction: its outcome is as unknown.
            failed(StreamError::Indeterminate {
                seq: 5,
                error: RpcError::Unavailable("gone".into())
            }),
        ]
    );
    assert_eq!(a.poll_timeout(), None);
}

/// A group transaction, spelled out by hand like [`append_cmd`]: the head
/// moves to the last entry, the entries follow from `first` on in the
/// order given, then the deletes of what falls out.
fn group_cmd(
    id: u64,
    guard: Revision,
    first: u64,
    payloads: &[&str],
    trims: &[u64],
) -> Command<AppendNotice> {
    let last = first + payloads.len() as u64 - 1;
    let mut success = vec![TxnOp::Put {
        key: b"/c/stream/s/head".to_vec(),
        value: last.to_string().into_bytes(),
        lease: 0,
    }];
    for (i, payload) in payloads.iter().enumerate() {
        let seq = first + i as u64;
        success.push(TxnOp::Put {
            key: format!("/c/stream/s/e/{seq:020}").into_bytes(),
            value: payload.as_bytes().to_vec(),
            lease: 0,
        });
    }
    for gone in trims {
        success.push(TxnOp::Delete(KeyRange::Key(
            format!("/c/stream/s/e/{gone:020}").into_bytes(),
        )));
    }
    rpc(
        id,
        Request::Txn(Txn {
            compare: head_guard(guard, first - 1),
            success,
            failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
                b"/c/stream/s/head".to_vec(),
            )))],
        }),
    )
}

#[test]
fn appends_queued_before_a_transaction_go_in_it_and_are_answered_in_order() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"a".to_vec()));
    a.handle(t0, AppendInput::Append(b"b".to_vec()));
    assert_eq!(drain(&mut a), vec![read_head_cmd(0)]);
    assert_eq!(a.pending(), 2);
    a.handle(t0, ok(0, range(3, vec![])));
    assert_eq!(drain(&mut a), vec![group_cmd(1, 0, 1, &["a", "b"], &[])]);
    // c queues behind the transaction in flight.
    a.handle(t0, AppendInput::Append(b"c".to_vec()));
    assert!(drain(&mut a).is_empty(), "one request at a time");
    a.handle(t0, ok(1, txn(true)));
    // c needs no read: the group's answer (revision 50) left the head at 2.
    assert_eq!(
        drain(&mut a),
        vec![appended(1), appended(2), append_cmd(2, 50, 3, "c", None)]
    );
    a.handle(t0, ok(2, txn(true)));
    assert_eq!(drain(&mut a), vec![appended(3)]);
    assert_eq!(a.pending(), 0);
}

/// A failed guard wrote nothing, so the next attempt takes in what queued
/// meanwhile; a group never exceeds `max_len` (an entry it writes would be
/// one it deletes) and trims one entry per entry written.
#[test]
fn a_retry_takes_in_appends_queued_meanwhile_and_groups_stay_within_max_len() {
    let t0 = start();
    let config = AppendConfig {
        head: Some(Head {
            seq: 4,
            mod_revision: 9,
        }),
        ..append_config(Some(3), 5)
    };
    let mut a = Append::new(config, t0, 1);
    a.handle(t0, AppendInput::Append(b"a".to_vec()));
    assert_eq!(drain(&mut a), vec![group_cmd(0, 9, 5, &["a"], &[2])]);
    for p in ["b", "c", "d"] {
        a.handle(t0, AppendInput::Append(p.as_bytes().to_vec()));
    }
    // Someone else appended entry 5 since the given head; the answer shows
    // that head, tried at once (news about the head, not a lost race).
    a.handle(t0, ok(0, lost_to("5", 11)));
    assert_eq!(
        drain(&mut a),
        vec![group_cmd(1, 11, 6, &["a", "b", "c"], &[3, 4, 5])]
    );
    a.handle(t0, ok(1, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![
            appended(6),
            appended(7),
            appended(8),
            group_cmd(2, 50, 9, &["d"], &[6])
        ]
    );
}

#[test]
fn a_group_carries_at_most_its_byte_budget_unless_one_payload_alone_is_larger() {
    let t0 = start();
    let config = AppendConfig {
        head: Some(Head {
            seq: 0,
            mod_revision: 0,
        }),
        max_group_bytes: 4,
        ..append_config(None, 5)
    };
    let mut a = Append::new(config, t0, 1);
    a.handle(t0, AppendInput::Append(b"first".to_vec()));
    for p in ["big..", "ab", "cd", "e"] {
        a.handle(t0, AppendInput::Append(p.as_bytes().to_vec()));
    }
    assert_eq!(drain(&mut a), vec![group_cmd(0, 0, 1, &["first"], &[])]);
    a.handle(t0, ok(0, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![appended(1), group_cmd(1, 50, 2, &["big.."], &[])]
    );
    a.handle(t0, ok(1, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![appended(2), group_cmd(2, 50, 3, &["ab", "cd"], &[])]
    );
}

/// A group in doubt is resent unchanged (what queued meanwhile waits), its
/// failure branch reads every entry, and one entry of ours settles the
/// whole group: each append is answered once, with its own ID.
#[test]
fn a_resent_group_is_settled_by_its_entries_and_answered_once_each() {
    let t0 = start();
    let config = AppendConfig {
        head: Some(Head {
            seq: 4,
            mod_revision: 9,
        }),
        ..append_config(None, 5)
    };
    let mut a = Append::new(config, t0, 1);
    a.handle(t0, AppendInput::Append(b"a".to_vec()));
    a.handle(t0, AppendInput::Append(b"b".to_vec()));
    drain(&mut a);
    a.handle(t0, ok(0, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![appended(5), group_cmd(1, 50, 6, &["b"], &[])]
    );
    a.handle(t0, AppendInput::Append(b"c".to_vec()));
    a.handle(t0, AppendInput::Append(b"d".to_vec()));
    a.handle(t0, ok(1, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![appended(6), group_cmd(2, 50, 7, &["c", "d"], &[])]
    );
    a.handle(t0, AppendInput::Append(b"e".to_vec()));
    a.handle(t0, unavailable(2));
    assert!(drain(&mut a).is_empty());
    a.handle_timeout(t0 + 10 * MS);
    let Command::Rpc {
        request: Request::Txn(mut expected),
        ..
    } = group_cmd(3, 50, 7, &["c", "d"], &[])
    else {
        unreachable!()
    };
    for seq in [7u64, 8] {
        expected
            .failure
            .push(TxnOp::Range(RangeRequest::all(KeyRange::Key(
                format!("/c/stream/s/e/{seq:020}").into_bytes(),
            ))));
    }
    assert_eq!(drain(&mut a), vec![rpc(3, Request::Txn(expected))]);
    // The lost attempt applied at revision 51; the head moved on since.
    a.handle(
        t0 + 10 * MS,
        ok(
            3,
            Response::Txn {
                revision: 60,
                succeeded: false,
                responses: vec![
                    TxnOpResponse::Range {
                        kvs: vec![head("9", 60)],
                    },
                    TxnOpResponse::Range {
                        kvs: vec![entry(7, "c", 51)],
                    },
                    TxnOpResponse::Range {
                        kvs: vec![entry(8, "d", 51)],
                    },
                ],
            },
        ),
    );
    assert_eq!(
        drain(&mut a),
        vec![
            Command::Notify(AppendNotice::Appended {
                seq: 7,
                revision: 51
            }),
            Command::Notify(AppendNotice::Appended {
                seq: 8,
                revision: 51
            }),
            group_cmd(4, 60, 10, &["e"], &[]),
        ]
    );
}

#[test]
fn late_and_unknown_replies_are_ignored() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    drain(&mut a);
    a.handle(t0, ok(7, txn(true)));
    a.handle(t0, ok(1, range(1, vec![])));
    assert!(drain(&mut a).is_empty());
    a.handle(t0, ok(0, txn(true)));
    assert_eq!(
        drain(&mut a),
        vec![failed(StreamError::Unexpected(format!(
            "{:?} to a head read",
            txn(true)
        )))]
    );
}

#[test]
fn stop_fails_the_running_and_queued_appends_and_everything_later() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"a".to_vec()));
    a.handle(t0, AppendInput::Append(b"b".to_vec()));
    drain(&mut a);
    a.handle(t0, AppendInput::Stop);
    assert_eq!(
        drain(&mut a),
        vec![
            Command::Cancel { id: RpcId(0) },
            failed(StreamError::Stopped),
            failed(StreamError::Stopped)
        ]
    );
    a.handle(t0, ok(0, range(1, vec![])));
    a.handle(t0, AppendInput::Append(b"c".to_vec()));
    assert_eq!(drain(&mut a), vec![failed(StreamError::Stopped)]);
    assert_eq!(a.poll_timeout(), None);

    // Stopped with the transaction in flight: it may still land.
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"a".to_vec()));
    a.handle(t0, ok(0, range(1, vec![])));
    drain(&mut a);
    a.handle(t0, AppendInput::Stop);
    assert_eq!(
        drain(&mut a),
        vec![
            Command::Cancel { id: RpcId(1) },
            failed(StreamError::Indeterminate {
                seq: 1,
                error: RpcError::Unavailable(
                    "stopped while the append transaction was in flight".into()
                )
            })
        ]
    );

    // Stopped while backing off: the timer goes, nothing was written.
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"a".to_vec()));
    a.handle(t0, ok(0, range(1, vec![])));
    a.handle(t0, ok(1, txn(false)));
    drain(&mut a);
    assert!(a.poll_timeout().is_some());
    a.handle(t0, AppendInput::Stop);
    assert_eq!(drain(&mut a), vec![failed(StreamError::Stopped)]);
    assert_eq!(a.poll_timeout(), None);
    a.handle_timeout(t0 + Duration::from_secs(1));
    assert!(drain(&mut a).is_empty());
}

#[test]
fn the_append_request_builder_matches_the_layout() {
    let keys = keys();
    let head = Head {
        seq: 41,
        mod_revision: 77,
    };
    let (seq, request) =
        requests::append(&keys, head, &[b"p".to_vec()], NonZeroU64::new(40)).expect("append");
    assert_eq!(seq, 42);
    assert_eq!(
        rpc::<AppendNotice>(0, request),
        append_cmd(0, 77, 42, "p", Some(2))
    );
    let at_max = Head {
        seq: u64::MAX,
        mod_revision: 1,
    };
    assert_eq!(
        requests::append(&keys, at_max, &[b"p".to_vec()], None),
        Err(StreamError::Exhausted)
    );
    assert_eq!(
        requests::parse_head(&keys, &[head_kv_other_key()]),
        Ok(Head::default()),
        "only the head key counts"
    );
}

fn head_kv_other_key() -> KeyValue {
    KeyValue {
        key: b"/c/stream/s/headless".to_vec(),
        value: b"zzz".to_vec(),
        ..KeyValue::default()
    }
}

// ---- reader ----

fn reader(from: ReadFrom, now: Instant) -> Reader {
    let config = ReaderConfig {
        keys: keys(),
        from,
        backoff: BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2,
            jitter_percent: 0,
        },
    };
    Reader::new(config, now, 1)
}

/// A page read from key `from`, as the reader sends it.
fn read_entries_cmd(id: u64, from: &[u8]) -> Command<ReaderNotice> {
    rpc(
        id,
        Request::Range(RangeRequest {
            limit: PAGE,
            ..RangeRequest::all(KeyRange::PrefixFrom {
                prefix: b"/c/stream/s/e/".to_vec(),
                from: from.to_vec(),
            })
        }),
    )
}

/// Where a page read resumes after entry `seq` was delivered.
fn after(seq: u64) -> Vec<u8> {
    keys().entry_key(seq + 1)
}

fn watch_cmd(id: u64, start_revision: Revision) -> Command<ReaderNotice> {
    rpc(
        id,
        Request::Watch {
            range: KeyRange::Prefix(b"/c/stream/s/e/".to_vec()),
            start_revision,
        },
    )
}

fn deliver(seq: u64, payload: &str) -> Command<ReaderNotice> {
    Command::Notify(ReaderNotice::Entry(Entry {
        seq,
        payload: payload.as_bytes().to_vec(),
    }))
}

fn live() -> Command<ReaderNotice> {
    Command::Notify(ReaderNotice::Live)
}

fn events(events: Vec<WatchEvent>) -> Response {
    Response::WatchEvents { events }
}

/// A Start reader that read entries 1..=3 at revision 10 and whose watch
/// (id 1) is established.
fn live_reader(now: Instant) -> Reader {
    let mut r = reader(ReadFrom::Start, now);
    let kvs = (1..=3)
        .map(|s| entry(s, &format!("p{s}"), s as i64 + 2))
        .collect();
    r.handle(now, ok(0, range(10, kvs)));
    r.handle(now, ok(1, events(vec![])));
    drain(&mut r);
    assert!(r.is_watching());
    r
}

#[test]
fn start_delivers_every_entry_in_order_then_live_then_watches_from_the_next_revision() {
    let t0 = start();
    let mut r = reader(ReadFrom::Start, t0);
    assert_eq!(drain(&mut r), vec![read_entries_cmd(0, b"/c/stream/s/e/")]);
    assert!(!r.is_live());
    let junk = KeyValue {
        key: b"/c/stream/s/e/junk".to_vec(),
        ..entry(1, "j", 4)
    };
    // Answer order does not matter; sequence order does.
    let kvs = vec![
        entry(3, "c", 7),
        junk.clone(),
        entry(1, "a", 5),
        entry(2, "b", 6),
    ];
    r.handle(t0, ok(0, range(10, kvs)));
    assert_eq!(
        drain(&mut r),
        vec![
            Command::Notify(ReaderNotice::InvalidKey(junk.key.clone())),
            deliver(1, "a"),
            deliver(2, "b"),
            deliver(3, "c"),
            live(),
            watch_cmd(1, 11),
        ]
    );
    assert!(r.is_live() && !r.is_watching());
    assert_eq!((r.last(), r.poll_timeout()), (3, None));
}

#[test]
fn watch_batches_deliver_new_entries_once_and_ignore_repeats_deletes_and_junk() {
    let t0 = start();
    let mut r = live_reader(t0);
    let junk = b"/c/stream/s/e/0001".to_vec();
    let batch = vec![
        put_event(entry(3, "p3", 5)),
        put_event(entry(4, "p4", 11)),
        delete_event(keys().entry_key(1), 11),
        put_event(KeyValue {
            key: junk.clone(),
            ..entry(9, "j", 12)
        }),
        put_event(entry(5, "p5", 13)),
    ];
    r.handle(t0, ok(1, events(batch)));
    assert_eq!(
        drain(&mut r),
        vec![
            Command::Notify(ReaderNotice::InvalidKey(junk.clone())),
            deliver(4, "p4"),
            deliver(5, "p5"),
        ]
    );
    // Repeats after a reconnect, and the same junk key again: nothing.
    r.handle(
        t0,
        ok(
            1,
            events(vec![
                put_event(entry(5, "p5", 13)),
                put_event(KeyValue {
                    key: junk,
                    ..entry(9, "j", 14)
                }),
            ]),
        ),
    );
    assert!(drain(&mut r).is_empty());
    assert_eq!(r.last(), 5);
}

#[test]
fn end_reads_only_the_head_and_delivers_what_comes_after_it() {
    let t0 = start();
    let mut r = reader(ReadFrom::End, t0);
    assert_eq!(drain(&mut r), vec![read_head_cmd(0)]);
    r.handle(t0, ok(0, range(7, vec![head("5", 7)])));
    assert_eq!(drain(&mut r), vec![live(), watch_cmd(1, 8)]);
    assert_eq!(r.last(), 5);
    r.handle(t0, ok(1, events(vec![put_event(entry(6, "new", 8))])));
    assert_eq!(drain(&mut r), vec![deliver(6, "new")]);
    // An empty stream's end is 0.
    let mut r = reader(ReadFrom::End, t0);
    r.handle(t0, ok(0, range(3, vec![])));
    assert_eq!(
        drain(&mut r),
        vec![read_head_cmd(0), live(), watch_cmd(1, 4)]
    );
}

fn head_and_entries(
    revision: Revision,
    head_kvs: Vec<KeyValue>,
    entries: Vec<KeyValue>,
) -> Response {
    Response::Txn {
        revision,
        succeeded: true,
        responses: vec![
            TxnOpResponse::Range { kvs: head_kvs },
            TxnOpResponse::Range { kvs: entries },
        ],
    }
}

#[test]
fn after_reads_head_and_entries_at_one_revision_skipping_trimmed_and_clamping_to_the_head() {
    let t0 = start();
    let mut r = reader(ReadFrom::After(2), t0);
    assert_eq!(
        drain(&mut r),
        vec![rpc(
            0,
            requests::read_head_and_entries(&keys(), &after(2), PAGE)
        )]
    );
    // Entry 3 was trimmed: the oldest retained one follows.
    let retained = vec![entry(4, "d", 14), entry(5, "e", 15), entry(6, "f", 16)];
    r.handle(
        t0,
        ok(
            0,
            head_and_entries(20, vec![head("6", 16)], retained.clone()),
        ),
    );
    assert_eq!(
        drain(&mut r),
        vec![
            deliver(4, "d"),
            deliver(5, "e"),
            deliver(6, "f"),
            live(),
            watch_cmd(1, 21)
        ]
    );
    // Beyond the head: the next append is the first entry.
    let mut r = reader(ReadFrom::After(100), t0);
    r.handle(
        t0,
        ok(0, head_and_entries(20, vec![head("6", 16)], retained)),
    );
    assert_eq!(
        drain(&mut r),
        vec![
            rpc(
                0,
                requests::read_head_and_entries(&keys(), &after(100), PAGE)
            ),
            live(),
            watch_cmd(1, 21)
        ]
    );
    assert_eq!(r.last(), 6);
    r.handle(t0, ok(1, events(vec![put_event(entry(7, "g", 21))])));
    assert_eq!(drain(&mut r), vec![deliver(7, "g")]);
}

#[test]
fn a_failed_or_compacted_watch_backs_off_then_rereads_after_the_last_delivered_entry() {
    let t0 = start();
    let mut r = live_reader(t0);
    r.handle(t0 + MS, unavailable(1));
    assert!(
        drain(&mut r).is_empty(),
        "the watch has ended: nothing to cancel"
    );
    assert_eq!(r.poll_timeout(), Some(t0 + 101 * MS));
    r.handle_timeout(t0 + 101 * MS);
    assert_eq!(drain(&mut r), vec![read_entries_cmd(2, &after(3))]);
    // Entries 1..=3 again (delivered already), 4 and 5 new; no second Live.
    let kvs = (1..=5)
        .map(|s| entry(s, &format!("p{s}"), s as i64 + 2))
        .collect();
    r.handle(t0 + 102 * MS, ok(2, range(30, kvs)));
    assert_eq!(
        drain(&mut r),
        vec![deliver(4, "p4"), deliver(5, "p5"), watch_cmd(3, 31)]
    );
    // Compaction cancels the watch; the same re-read follows, with the
    // backoff grown because no watch was established in between.
    let t1 = t0 + 200 * MS;
    r.handle(
        t1,
        ok(
            3,
            Response::WatchCanceled {
                compact_revision: 40,
            },
        ),
    );
    assert_eq!(r.poll_timeout(), Some(t1 + 200 * MS));
    r.handle_timeout(t1 + 200 * MS);
    assert_eq!(drain(&mut r), vec![read_entries_cmd(4, &after(5))]);
    r.handle(
        t1 + 200 * MS,
        ok(4, range(45, vec![entry(5, "p5", 7), entry(6, "p6", 44)])),
    );
    assert_eq!(drain(&mut r), vec![deliver(6, "p6"), watch_cmd(5, 46)]);
    // Established again: the next failure starts from the initial delay.
    let t2 = t1 + 300 * MS;
    r.handle(t2, ok(5, events(vec![])));
    r.handle(t2, unavailable(5));
    assert_eq!(r.poll_timeout(), Some(t2 + 100 * MS));
}

#[test]
fn a_failed_first_read_is_retried_with_the_same_position() {
    let t0 = start();
    let mut r = reader(ReadFrom::End, t0);
    drain(&mut r);
    r.handle(t0, unavailable(0));
    r.handle_timeout(t0 + 100 * MS);
    assert_eq!(drain(&mut r), vec![read_head_cmd(1)]);
    // A nonsense answer counts as a failure, too.
    r.handle(t0 + 100 * MS, ok(1, txn(true)));
    r.handle_timeout(t0 + 300 * MS);
    assert_eq!(drain(&mut r), vec![read_head_cmd(2)]);
    assert!(!r.is_live());
}

#[test]
fn a_garbage_head_or_a_refused_request_fails_the_reader_for_good() {
    let t0 = start();
    let mut r = reader(ReadFrom::End, t0);
    drain(&mut r);
    r.handle(t0, ok(0, range(3, vec![head("-1", 3)])));
    assert_eq!(
        drain(&mut r),
        vec![Command::Notify(ReaderNotice::Failed(
            StreamError::BadHead {
                value: b"-1".to_vec()
            }
        ))]
    );
    assert_eq!(r.poll_timeout(), None);
    r.handle(t0, ReaderInput::ConsumerReady);
    assert!(drain(&mut r).is_empty());

    let mut r = live_reader(t0);
    let refused = RpcError::Rejected("permission denied".into());
    r.handle(t0, reply(1, Err(refused.clone())));
    assert_eq!(
        drain(&mut r),
        vec![Command::Notify(ReaderNotice::Failed(StreamError::Rpc(
            refused
        )))]
    );
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn a_full_consumer_pauses_the_reader_and_ready_rereads_after_the_last_entry() {
    let t0 = start();
    let mut r = live_reader(t0);
    r.handle(t0, ReaderInput::ConsumerFull);
    assert_eq!(drain(&mut r), vec![Command::Cancel { id: RpcId(1) }]);
    r.handle(t0, ok(1, events(vec![put_event(entry(4, "late", 11))])));
    assert!(drain(&mut r).is_empty(), "a canceled watch is ignored");
    assert_eq!(r.poll_timeout(), None);
    r.handle(t0, ReaderInput::ConsumerReady);
    assert_eq!(drain(&mut r), vec![read_entries_cmd(2, &after(3))]);
    let kvs = vec![entry(3, "p3", 5), entry(4, "p4", 11)];
    r.handle(t0, ok(2, range(12, kvs)));
    assert_eq!(drain(&mut r), vec![deliver(4, "p4"), watch_cmd(3, 13)]);

    // Full before the first read: that read, position included, waits.
    let mut r = reader(ReadFrom::End, t0);
    r.handle(t0, ReaderInput::ConsumerFull);
    r.handle(t0, ReaderInput::ConsumerReady);
    assert_eq!(
        drain(&mut r),
        vec![
            read_head_cmd(0),
            Command::Cancel { id: RpcId(0) },
            read_head_cmd(1)
        ]
    );
}

#[test]
fn stop_cancels_and_then_nothing_happens() {
    let t0 = start();
    let mut r = live_reader(t0);
    r.handle(t0, unavailable(1));
    assert!(r.poll_timeout().is_some());
    r.handle(t0, ReaderInput::Stop);
    assert!(drain(&mut r).is_empty(), "only a timer was pending");
    assert_eq!(r.poll_timeout(), None);
    r.handle_timeout(t0 + Duration::from_secs(5));
    r.handle(t0 + Duration::from_secs(5), ReaderInput::ConsumerReady);
    assert!(drain(&mut r).is_empty());

    let mut r = live_reader(t0);
    r.handle(t0, ReaderInput::Stop);
    assert_eq!(drain(&mut r), vec![Command::Cancel { id: RpcId(1) }]);
    r.handle(t0, ok(1, events(vec![put_event(entry(4, "late", 11))])));
    assert!(drain(&mut r).is_empty());
}

#[test]
fn the_cursor_delivers_only_entries_after_the_last_in_order() {
    let keys = keys();
    let mut c = Cursor::new(2);
    let batch = c.read(
        &keys,
        vec![entry(5, "e", 9), entry(1, "a", 3), entry(3, "c", 5)],
    );
    assert_eq!(
        batch.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 5],
        "sorted, repeats dropped, the trimmed 4 skipped"
    );
    assert_eq!(c.last(), 5);
    let batch = c.events(
        &keys,
        vec![
            put_event(entry(4, "late", 8)),
            put_event(entry(6, "f", 10)),
            put_event(entry(6, "f again", 10)),
        ],
    );
    assert_eq!(batch.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [6]);
    assert!(!c.admit(6) && c.admit(7) && c.last() == 7);
    assert_eq!(c.resume_key(&keys), keys.entry_key(8));
}

#[test]
fn a_full_page_is_followed_by_the_next_one_and_only_the_last_page_opens_the_watch() {
    let t0 = start();
    let mut r = reader(ReadFrom::Start, t0);
    drain(&mut r);
    let page: u64 = PAGE.try_into().unwrap();
    let first: Vec<KeyValue> = (1..=page).map(|s| entry(s, "x", 5)).collect();
    r.handle(t0, ok(0, range(10, first)));
    let commands = drain(&mut r);
    // Every entry of the page, Live (the reader is live after one page),
    // then the next page from just after the last key read.
    assert_eq!(commands.len(), PAGE as usize + 2);
    assert_eq!(commands[PAGE as usize], live());
    assert_eq!(
        commands[PAGE as usize + 1],
        read_entries_cmd(1, &rpc::key_after(&keys().entry_key(page)))
    );
    // A short page is the last: the watch starts after its revision.
    r.handle(t0, ok(1, range(12, vec![entry(page + 1, "y", 11)])));
    assert_eq!(
        drain(&mut r),
        vec![deliver(page + 1, "y"), watch_cmd(2, 13)]
    );
}

#[test]
fn a_refused_page_is_read_again_with_half_as_many_entries_down_to_one() {
    let t0 = start();
    let mut r = reader(ReadFrom::Start, t0);
    drain(&mut r);
    // etcd-client refuses an answer over its message limit.
    let too_large = || reply(0, Err(RpcError::Rejected("message too large".into())));
    r.handle(t0, too_large());
    let halved = Request::Range(RangeRequest {
        limit: PAGE / 2,
        ..RangeRequest::all(KeyRange::PrefixFrom {
            prefix: b"/c/stream/s/e/".to_vec(),
            from: b"/c/stream/s/e/".to_vec(),
        })
    });
    assert_eq!(drain(&mut r), vec![rpc(1, halved)]);
    // Refused down to a single entry: then it is final.
    let mut id = 1;
    let mut failed = false;
    while !failed {
        r.handle(
            t0,
            reply(id, Err(RpcError::Rejected("message too large".into()))),
        );
        id += 1;
        failed = drain(&mut r)
            .iter()
            .any(|c| matches!(c, Command::Notify(ReaderNotice::Failed(_))));
        assert!(id < 20, "never gave up");
    }
    assert_eq!(id, 1 + PAGE.ilog2() as u64, "one refusal per halving");
}

#[test]
fn a_non_transaction_answer_to_the_append_fails_it_as_unexpected() {
    let t0 = start();
    let mut a = Append::new(append_config(None, 5), t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, range(3, vec![])));
    a.handle(t0, ok(1, range(3, vec![])));
    let commands = drain(&mut a);
    assert_eq!(
        commands[..2],
        [read_head_cmd(0), append_cmd(1, 0, 1, "x", None)]
    );
    assert!(
        matches!(
            &commands[2..],
            [Command::Notify(AppendNotice::Failed(StreamError::Unexpected(what)))]
                if what.ends_with("to an append transaction")
        ),
        "{commands:?}"
    );
    assert_eq!(a.poll_timeout(), None);
    // Nothing is known about the write: the next append is still guarded
    // on the head read before it, which a stale guard would refuse.
    a.handle(t0, AppendInput::Append(b"y".to_vec()));
    assert_eq!(drain(&mut a), vec![append_cmd(2, 0, 1, "y", None)]);
}

#[test]
fn without_a_backoff_a_lost_race_tries_the_head_it_lost_to_at_once() {
    let t0 = start();
    let config = AppendConfig {
        backoff: BackoffConfig {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            multiplier: 2,
            jitter_percent: 0,
        },
        ..append_config(None, 3)
    };
    let mut a = Append::new(config, t0, 1);
    a.handle(t0, AppendInput::Append(b"x".to_vec()));
    a.handle(t0, ok(0, range(4, vec![head("3", 4)])));
    a.handle(t0, ok(1, lost_to("4", 5)));
    assert_eq!(
        drain(&mut a),
        vec![
            read_head_cmd(0),
            append_cmd(1, 4, 4, "x", None),
            append_cmd(2, 5, 5, "x", None)
        ]
    );
    assert_eq!(a.poll_timeout(), None, "no timer for a zero delay");
    a.handle(t0, ok(2, lost_to("5", 6)));
    a.handle(t0, ok(3, lost_to("6", 7)));
    // max_attempts still bounds the busy retries.
    assert_eq!(
        drain(&mut a),
        vec![
            append_cmd(3, 6, 6, "x", None),
            failed(StreamError::Contended { attempts: 3 })
        ]
    );
}

#[test]
fn a_head_and_entries_answer_of_the_wrong_shape_is_retried_not_delivered() {
    let t0 = start();
    let mut r = reader(ReadFrom::After(2), t0);
    let read = rpc(0, requests::read_head_and_entries(&keys(), &after(2), PAGE));
    assert_eq!(drain(&mut r), vec![read]);
    // Only one of the two ranges: not the answer to this read.
    let short = Response::Txn {
        revision: 20,
        succeeded: true,
        responses: vec![TxnOpResponse::Range {
            kvs: vec![head("6", 16)],
        }],
    };
    r.handle(t0, ok(0, short));
    assert!(drain(&mut r).is_empty());
    assert_eq!(r.poll_timeout(), Some(t0 + 100 * MS));
    r.handle_timeout(t0 + 100 * MS);
    assert_eq!(
        drain(&mut r),
        vec![rpc(
            1,
            requests::read_head_and_entries(&keys(), &after(2), PAGE)
        )]
    );
    // A third response is as wrong as a missing one.
    let long = Response::Txn {
        revision: 20,
        succeeded: true,
        responses: vec![
            TxnOpResponse::Range {
                kvs: vec![head("6", 16)],
            },
            TxnOpResponse::Range {
                kvs: vec![entry(3, "c", 13)],
            },
            TxnOpResponse::Range { kvs: vec![] },
        ],
    };
    r.handle(t0 + 100 * MS, ok(1, long));
    assert!(drain(&mut r).is_empty());
    assert!(!r.is_live());
    assert_eq!(r.poll_timeout(), Some(t0 + 300 * MS));
}

mod place {
    use fleetcoord_sm::stream::{Cursor, Offered, Place, ReadFrom};

    #[test]
    fn a_reader_starts_at_the_first_entry_the_head_or_after_an_id_never_beyond_the_head() {
        assert_eq!(Cursor::at(ReadFrom::Start, 9).last(), 0);
        assert_eq!(Cursor::at(ReadFrom::End, 9).last(), 9);
        assert_eq!(Cursor::at(ReadFrom::After(4), 9).last(), 4);
        assert_eq!(Cursor::at(ReadFrom::After(40), 9).last(), 9);
        assert_eq!(Cursor::at(ReadFrom::End, 0).last(), 0);
        // The epoch is known only once the place is inside the stream.
        let head = Some((9, Some(b"e1".to_vec())));
        let mut inside = Place::open(ReadFrom::End, head.clone());
        assert_eq!(inside.offer(10, Some(b"e2")), Offered::Recreated);
        let mut outside = Place::open(ReadFrom::Start, head);
        assert_eq!(outside.offer(1, Some(b"e1")), Offered::Deliver);
    }

    #[test]
    fn entries_are_delivered_once_in_order_and_repeats_dropped() {
        let mut p = Place::open(ReadFrom::Start, None);
        let e: Option<&[u8]> = Some(b"e");
        assert_eq!(p.offer(1, e), Offered::Deliver);
        assert_eq!(p.offer(3, e), Offered::Deliver, "a trimmed 2 is skipped");
        assert_eq!(p.offer(3, e), Offered::Repeat);
        assert_eq!(p.offer(2, e), Offered::Repeat);
        assert_eq!(p.last(), 3);
        // Without epochs (NATS), only the sequence counts.
        let mut n = Place::open(ReadFrom::After(5), Some((7, None)));
        assert_eq!(n.offer(5, None), Offered::Repeat);
        assert_eq!(n.offer(6, None), Offered::Deliver);
    }

    #[test]
    fn a_stream_recreated_under_the_reader_is_read_again_from_its_first_entry() {
        let old: Option<&[u8]> = Some(b"old");
        let new: Option<&[u8]> = Some(b"new");
        let mut p = Place::open(ReadFrom::Start, None);
        assert_eq!(p.offer(1, old), Offered::Deliver);
        assert_eq!(p.offer(2, old), Offered::Deliver);
        // The head agrees: nothing happens.
        assert!(!p.check_head(Some((Some(2), old))));
        // An entry of another epoch: start over, then deliver from 1.
        assert_eq!(p.offer(1, new), Offered::Recreated);
        assert_eq!(p.last(), 0);
        assert_eq!(p.offer(1, new), Offered::Deliver);
        // The head below the place, or gone, or of another epoch.
        assert_eq!(p.offer(2, new), Offered::Deliver);
        assert!(p.check_head(Some((Some(1), new))));
        assert_eq!(p.last(), 0);
        assert_eq!(p.offer(1, new), Offered::Deliver);
        assert!(p.check_head(None));
        assert!(
            !p.check_head(None),
            "an empty stream and an empty place agree"
        );
        assert_eq!(p.offer(1, old), Offered::Deliver);
        assert!(p.check_head(Some((Some(5), new))));
    }
}
