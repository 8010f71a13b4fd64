//! The etcd requests of the stream protocol, in one place so the key layout
//! and the append guard are defined once (see the [module docs](super)).

use super::{parse_seq, Head, StreamError, StreamKeys};
use crate::rpc::{
    Compare, KeyRange, KeyValue, RangeRequest, Request, Revision, Txn, TxnOp, TxnOpResponse,
};
use std::num::NonZeroU64;

/// Read the head key.
pub fn read_head(keys: &StreamKeys) -> Request {
    Request::Range(RangeRequest::all(KeyRange::Key(keys.head().to_vec())))
}

/// Read one page of entries: at most `page` keys of the entry prefix from
/// key `from` on, in key order (which is sequence order: entry keys are
/// zero-padded). A full page means there may be more; the next page starts
/// just after its last key. Reading page by page keeps every answer under
/// the gRPC message limit and lets a slow consumer pause the reader
/// between pages, so a stream of any length is read in bounded memory.
pub fn read_entries(keys: &StreamKeys, from: &[u8], page: i64) -> Request {
    Request::Range(entries_range(keys, from, page))
}

/// Read the head and the first page of entries from `from` at one
/// revision, so a reader starting after an ID can clamp it to the head and
/// take the entries from the same snapshot. Answered by a [`Txn`] response
/// with two ranges.
pub fn read_head_and_entries(keys: &StreamKeys, from: &[u8], page: i64) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![
            TxnOp::Range(RangeRequest::all(KeyRange::Key(keys.head().to_vec()))),
            TxnOp::Range(entries_range(keys, from, page)),
        ],
        failure: vec![],
    })
}

fn entries_range(keys: &StreamKeys, from: &[u8], page: i64) -> RangeRequest {
    RangeRequest {
        limit: page,
        ..RangeRequest::all(KeyRange::PrefixFrom {
            prefix: keys.entry_prefix().to_vec(),
            from: from.to_vec(),
        })
    }
}

/// Watch the entry prefix from `start_revision`.
pub fn watch_entries(keys: &StreamKeys, start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(keys.entry_prefix().to_vec()),
        start_revision,
    }
}

/// The head from the keys of a head read: none means a new stream.
pub fn parse_head(keys: &StreamKeys, kvs: &[KeyValue]) -> Result<Head, StreamError> {
    match kvs.iter().find(|kv| kv.key == keys.head()) {
        None => Ok(Head::default()),
        Some(kv) => match parse_seq(&kv.value) {
            Some(seq) => Ok(Head {
                seq,
                mod_revision: kv.mod_revision,
            }),
            None => Err(StreamError::BadHead {
                value: kv.value.clone(),
            }),
        },
    }
}

/// The append transaction after `head`: if the head key's mod revision is
/// still `head.mod_revision`, set the head to the next sequence number,
/// write the entry, and with `max_len` delete the entry that falls out;
/// otherwise read the head. Returns the sequence number the entry gets if
/// the guard holds.
///
/// The guard is on the mod revision, not the value: a head rewritten with
/// the same value by someone else still changes its mod revision, so no two
/// appenders can both win.
pub fn append(
    keys: &StreamKeys,
    head: Head,
    payload: &[u8],
    max_len: Option<NonZeroU64>,
) -> Result<(u64, Request), StreamError> {
    append_txn(keys, head, payload, max_len).map(|(seq, txn)| (seq, Request::Txn(txn)))
}

fn append_txn(
    keys: &StreamKeys,
    head: Head,
    payload: &[u8],
    max_len: Option<NonZeroU64>,
) -> Result<(u64, Txn), StreamError> {
    let seq = head.seq.checked_add(1).ok_or(StreamError::Exhausted)?;
    let mut success = vec![
        TxnOp::Put {
            key: keys.head().to_vec(),
            value: seq.to_string().into_bytes(),
            lease: 0,
        },
        TxnOp::Put {
            key: keys.entry_key(seq),
            value: payload.to_vec(),
            lease: 0,
        },
    ];
    // `max_len` >= 1, so the entry deleted is never the one just written.
    if let Some(gone) = max_len.and_then(|max| seq.checked_sub(max.get())) {
        if gone > 0 {
            success.push(TxnOp::Delete(KeyRange::Key(keys.entry_key(gone))));
        }
    }
    let txn = Txn {
        compare: vec![Compare::ModRevisionEquals {
            key: keys.head().to_vec(),
            revision: head.mod_revision,
        }],
        success,
        // A lost race reads the head it lost to, so the next attempt needs
        // no read of its own ([`head_of_failed_append`]).
        failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
            keys.head().to_vec(),
        )))],
    };
    Ok((seq, txn))
}

/// The [`append`] transaction after `head` sent again after an attempt
/// whose answer was lost: the same guard and the same writes, so of all the
/// copies at most one can apply (each needs the head at
/// `head.mod_revision`, and the first to apply moves it). Its failure
/// branch reads the head and entry `seq` as well, so one answer says
/// whether the lost attempt wrote the entry ([`resend_outcome`]).
pub fn resend(
    keys: &StreamKeys,
    head: Head,
    payload: &[u8],
    max_len: Option<NonZeroU64>,
) -> Result<(u64, Request), StreamError> {
    let (seq, mut txn) = append_txn(keys, head, payload, max_len)?;
    txn.failure
        .push(TxnOp::Range(RangeRequest::all(KeyRange::Key(
            keys.entry_key(seq),
        ))));
    Ok((seq, Request::Txn(txn)))
}

/// What the failed guard of a [`resend`] says about the lost attempt that
/// would have written `payload` as entry `seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resent {
    /// Entry `seq` holds `payload`: the lost attempt wrote it, at this
    /// revision (the head's mod revision right after it).
    Written {
        /// The revision of the write.
        revision: Revision,
        /// The head now, if the answer showed a valid one.
        head: Option<Head>,
    },
    /// Another appender took `seq` (entry `seq` holds another payload, or
    /// the head never reached `seq`): the lost attempt wrote nothing.
    Lost {
        /// The head now, if the answer showed a valid one.
        head: Option<Head>,
    },
    /// Entry `seq` is gone although the head passed it (trimmed, or deleted
    /// by hand): nothing can tell whether it was ours.
    Unknown,
}

/// Decides [`Resent`] from the answer of a [`resend`] whose guard failed.
///
/// Entry keys are written once, by the transaction that moves the head to
/// their sequence number, so the entry at `seq` is the write of whichever
/// transaction took `seq`; a head that has not reached `seq` proves that
/// none did. Payloads carry no identity, so a concurrent
/// appender that took `seq` with byte-identical payload is taken for the
/// lost attempt (the fleetcoord stream docs say so).
pub fn resend_outcome(
    keys: &StreamKeys,
    seq: u64,
    payload: &[u8],
    responses: Vec<TxnOpResponse>,
) -> Result<Resent, StreamError> {
    let mut it = responses.into_iter();
    let (Some(TxnOpResponse::Range { kvs: head_kvs }), Some(TxnOpResponse::Range { kvs: entry })) =
        (it.next(), it.next())
    else {
        return Err(StreamError::Unexpected(
            "the answer to a resent append lacks its head and entry reads".into(),
        ));
    };
    let head = parse_head(keys, &head_kvs);
    let wanted = keys.entry_key(seq);
    match entry.into_iter().find(|kv| kv.key == wanted) {
        Some(kv) if kv.value == payload => Ok(Resent::Written {
            revision: kv.mod_revision,
            head: head.ok(),
        }),
        Some(_) => Ok(Resent::Lost { head: head.ok() }),
        None => match head {
            Ok(now) if now.seq < seq => Ok(Resent::Lost { head: Some(now) }),
            // The head passed `seq`, or is garbage: either way the entry
            // that would tell is not there.
            Ok(_) | Err(_) => Ok(Resent::Unknown),
        },
    }
}

/// The current head from the answer of an [`append`] whose guard failed:
/// its failure branch read the head key. `Ok(None)` when the answer does
/// not carry that read (the next attempt then reads the head first); a
/// head value that is not a sequence number is [`StreamError::BadHead`].
pub fn head_of_failed_append(
    keys: &StreamKeys,
    responses: Vec<TxnOpResponse>,
) -> Result<Option<Head>, StreamError> {
    match responses.into_iter().next() {
        Some(TxnOpResponse::Range { kvs }) => parse_head(keys, &kvs).map(Some),
        _ => Ok(None),
    }
}

/// The two key lists of a [`read_head_and_entries`] answer: `(head, entries)`.
pub fn split_head_and_entries(
    responses: Vec<TxnOpResponse>,
) -> Option<(Vec<KeyValue>, Vec<KeyValue>)> {
    let mut it = responses.into_iter();
    match (it.next(), it.next(), it.next()) {
        (
            Some(TxnOpResponse::Range { kvs: head }),
            Some(TxnOpResponse::Range { kvs: entries }),
            None,
        ) => Some((head, entries)),
        _ => None,
    }
}
