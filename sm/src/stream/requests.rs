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

/// The append transaction after `head` for a group of payloads, in order:
/// if the head key's mod revision is still `head.mod_revision`, set the
/// head to `head.seq + payloads.len()`, write the entries `head.seq + 1`…
/// in one go, and with `max_len` delete the entries that fall out;
/// otherwise read the head. Returns the sequence number the first payload
/// gets if the guard holds (the others follow it, one apart).
///
/// The guard is on the mod revision, so that a head rewritten with the
/// same value by someone else still counts as moved and no two appenders
/// can both win; and on the value too, so that a `head` whose `seq` does
/// not belong to its revision fails instead of overwriting entries. A group is applied whole or not at all (one
/// transaction), so it is one append for every other rule here. It must
/// not be empty, nor longer than `max_len` (the caller's grouping keeps
/// both), so no entry it writes is also one it deletes — etcd refuses a
/// transaction that names a key twice.
pub fn append(
    keys: &StreamKeys,
    head: Head,
    payloads: &[Vec<u8>],
    max_len: Option<NonZeroU64>,
) -> Result<(u64, Request), StreamError> {
    append_txn(keys, head, payloads, max_len).map(|(seq, txn)| (seq, Request::Txn(txn)))
}

fn append_txn(
    keys: &StreamKeys,
    head: Head,
    payloads: &[Vec<u8>],
    max_len: Option<NonZeroU64>,
) -> Result<(u64, Txn), StreamError> {
    let count = u64::try_from(payloads.len()).map_err(|_| StreamError::Exhausted)?;
    if count == 0 || max_len.is_some_and(|max| count > max.get()) {
        return Err(StreamError::Unexpected(format!(
            "an append group of {count} entries (maximum length {max_len:?})"
        )));
    }
    let first = head.seq.checked_add(1).ok_or(StreamError::Exhausted)?;
    let last = head.seq.checked_add(count).ok_or(StreamError::Exhausted)?;
    let mut success = Vec::with_capacity(payloads.len().saturating_mul(2).saturating_add(1));
    success.push(TxnOp::Put {
        key: keys.head().to_vec(),
        value: last.to_string().into_bytes(),
        lease: 0,
    });
    for (seq, payload) in (first..=last).zip(payloads) {
        success.push(TxnOp::Put {
            key: keys.entry_key(seq),
            value: payload.clone(),
            lease: 0,
        });
    }
    // Entry `seq` pushes out `seq - max_len`: at most `head.seq`, since the
    // group is no longer than `max_len`, so never an entry written here.
    if let Some(max) = max_len {
        for seq in first..=last {
            if let Some(gone) = seq.checked_sub(max.get()).filter(|gone| *gone > 0) {
                success.push(TxnOp::Delete(KeyRange::Key(keys.entry_key(gone))));
            }
        }
    }
    let mut compare = vec![Compare::ModRevisionEquals {
        key: keys.head().to_vec(),
        revision: head.mod_revision,
    }];
    // The revision alone decides the race; the value makes a head pair
    // etcd never held (a real revision with another `seq`, which would
    // write over entries) fail as a lost race instead of writing.
    if head.mod_revision != 0 {
        compare.push(Compare::ValueEquals {
            key: keys.head().to_vec(),
            value: head.seq.to_string().into_bytes(),
        });
    }
    let txn = Txn {
        compare,
        success,
        // A lost race reads the head it lost to, so the next attempt needs
        // no read of its own ([`head_of_failed_append`]).
        failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
            keys.head().to_vec(),
        )))],
    };
    Ok((first, txn))
}

/// The [`append`] transaction after `head` sent again after an attempt
/// whose answer was lost: the same guard and the same writes, so of all the
/// copies at most one can apply (each needs the head at
/// `head.mod_revision`, and the first to apply moves it). Its failure
/// branch reads the head and every entry of the group as well, so one
/// answer says whether the lost attempt wrote them ([`resend_outcome`]).
pub fn resend(
    keys: &StreamKeys,
    head: Head,
    payloads: &[Vec<u8>],
    max_len: Option<NonZeroU64>,
) -> Result<(u64, Request), StreamError> {
    let (first, mut txn) = append_txn(keys, head, payloads, max_len)?;
    for seq in (first..).take(payloads.len()) {
        txn.failure
            .push(TxnOp::Range(RangeRequest::all(KeyRange::Key(
                keys.entry_key(seq),
            ))));
    }
    Ok((first, Request::Txn(txn)))
}

/// What the failed guard of a [`resend`] says about the lost attempt that
/// would have written its group of payloads from entry `seq` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resent {
    /// The entries from `seq` on hold the group: the lost attempt wrote
    /// it, at this revision (the head's mod revision right after it).
    Written {
        /// The revision of the write.
        revision: Revision,
        /// The head now, if the answer showed a valid one.
        head: Option<Head>,
    },
    /// Another appender took `seq` (an entry holds another payload, or
    /// the head never reached `seq`): the lost attempt wrote nothing.
    Lost {
        /// The head now, if the answer showed a valid one.
        head: Option<Head>,
    },
    /// Every entry of the group is gone although the head passed them
    /// (trimmed, or deleted by hand): nothing can tell whether they were ours.
    Unknown,
}

/// Decides [`Resent`] from the answer of a [`resend`] of `payloads` from
/// entry `seq` on whose guard failed.
///
/// Entry keys are written once, by the transaction that moves the head past
/// their sequence number, and a group is one transaction, so the entries
/// from `seq` on are all the lost attempt's or none are; a head that has not
/// reached `seq` proves that none are. Payloads carry no identity, so a
/// concurrent appender that took the same sequence numbers with
/// byte-identical payloads is taken for the lost attempt (the fleetcoord
/// stream docs say so).
pub fn resend_outcome(
    keys: &StreamKeys,
    seq: u64,
    payloads: &[Vec<u8>],
    responses: Vec<TxnOpResponse>,
) -> Result<Resent, StreamError> {
    let mut it = responses.into_iter();
    let Some(TxnOpResponse::Range { kvs: head_kvs }) = it.next() else {
        return Err(missing_reads());
    };
    let head = parse_head(keys, &head_kvs);
    // One entry of ours proves the whole group (one transaction wrote it);
    // the others may have been trimmed since.
    let mut revision = None;
    for (at, payload) in (seq..).zip(payloads) {
        let Some(TxnOpResponse::Range { kvs }) = it.next() else {
            return Err(missing_reads());
        };
        let wanted = keys.entry_key(at);
        match kvs.into_iter().find(|kv| kv.key == wanted) {
            Some(kv) if kv.value == *payload => {
                revision = Some(kv.mod_revision);
            }
            Some(_) => return Ok(Resent::Lost { head: head.ok() }),
            None => {}
        }
    }
    match revision {
        Some(revision) => Ok(Resent::Written {
            revision,
            head: head.ok(),
        }),
        None => match head {
            Ok(now) if now.seq < seq => Ok(Resent::Lost { head: Some(now) }),
            // The head passed `seq`, or is garbage: either way an entry
            // that would tell is not there.
            Ok(_) | Err(_) => Ok(Resent::Unknown),
        },
    }
}

fn missing_reads() -> StreamError {
    StreamError::Unexpected("the answer to a resent append lacks its head and entry reads".into())
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
