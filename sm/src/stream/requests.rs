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
    Ok((seq, Request::Txn(txn)))
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
