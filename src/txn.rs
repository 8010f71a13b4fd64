//! The operations and results of a fenced transaction
//! ([`crate::Leadership::txn_if_leader`]).
//!
//! These wrap the plain-data etcd vocabulary of `fleetcoord-sm` so that a
//! user needs only `fleetcoord` as a dependency, and so that `fleetcoord`'s
//! API does not change whenever the state machines' internal vocabulary does.

use crate::error::{Error, Result};
use crate::validate;
use fleetcoord_sm as sm;

/// One operation of a transaction, run by
/// [`Leadership::txn_if_leader`](crate::Leadership::txn_if_leader).
///
/// Keys and values are bytes; anything that converts into `Vec<u8>`
/// (`&str`, `String`, `&[u8]`, `b"..."`) is accepted. Keys and prefixes
/// must not be empty: an empty prefix would cover the whole keyspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnOp(sm::TxnOp);

impl TxnOp {
    /// Write `key = value`, not bound to any lease.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> TxnOp {
        Self::put_with_lease(key, value, 0)
    }

    /// Write `key = value`, bound to `lease`: etcd deletes the key when the
    /// lease ends. With [`Leadership::lease`](crate::Leadership::lease) the
    /// key lives exactly as long as the leader's session.
    pub fn put_with_lease(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> TxnOp {
        TxnOp(sm::TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease,
        })
    }

    /// Read `key`; answered by [`TxnOpResponse::Get`] with zero or one
    /// entry.
    pub fn get(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp(sm::TxnOp::Range(sm::RangeRequest::all(sm::KeyRange::Key(
            key.into(),
        ))))
    }

    /// Read every key starting with `prefix`, in key order; answered by
    /// [`TxnOpResponse::Get`].
    pub fn get_prefix(prefix: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp(sm::TxnOp::Range(sm::RangeRequest::all(
            sm::KeyRange::Prefix(prefix.into()),
        )))
    }

    /// Delete `key`; answered by [`TxnOpResponse::Delete`].
    pub fn delete(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp(sm::TxnOp::Delete(sm::KeyRange::Key(key.into())))
    }

    /// Delete every key starting with `prefix`; answered by
    /// [`TxnOpResponse::Delete`].
    pub fn delete_prefix(prefix: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp(sm::TxnOp::Delete(sm::KeyRange::Prefix(prefix.into())))
    }

    /// The op in the machines' vocabulary, after checking it.
    pub(crate) fn into_checked(self) -> Result<sm::TxnOp> {
        let key = match &self.0 {
            sm::TxnOp::Put { key, .. } => key,
            sm::TxnOp::Range(r) => range_key(&r.range),
            sm::TxnOp::Delete(range) => range_key(range),
        };
        if key.is_empty() {
            return Err(Error::invalid(
                "ops",
                "a key or prefix is empty (an empty prefix would cover every key)",
            ));
        }
        Ok(self.0)
    }

    /// Bytes this op adds to a request, for the size check.
    pub(crate) fn size(&self) -> usize {
        match &self.0 {
            sm::TxnOp::Put { key, value, .. } => key.len() + value.len(),
            sm::TxnOp::Range(r) => range_key(&r.range).len(),
            sm::TxnOp::Delete(range) => range_key(range).len(),
        }
    }
}

fn range_key(range: &sm::KeyRange) -> &[u8] {
    match range {
        sm::KeyRange::Key(k) | sm::KeyRange::Prefix(k) => k,
        sm::KeyRange::PrefixFrom { from, .. } | sm::KeyRange::PrefixSpan { from, .. } => from,
    }
}

/// Checks `ops` and turns them into the machines' vocabulary: no empty key
/// or prefix, and no more bytes than one etcd request may carry.
pub(crate) fn check_ops(ops: impl IntoIterator<Item = TxnOp>) -> Result<Vec<sm::TxnOp>> {
    let ops: Vec<TxnOp> = ops.into_iter().collect();
    let size: usize = ops.iter().map(TxnOp::size).sum();
    if size > validate::MAX_PAYLOAD {
        return Err(Error::invalid(
            "ops",
            format!(
                "carry {size} bytes of keys and values; at most {} fit in one etcd request",
                validate::MAX_PAYLOAD
            ),
        ));
    }
    ops.into_iter().map(TxnOp::into_checked).collect()
}

/// What etcd's answer to a fenced transaction (`fenced_txn`: the user's
/// ops guarded by the holder's key and token, an empty failure branch)
/// means: the ops' answers when the guard held; `None` when it did not, in
/// which case nothing ran and `refused` is called first, so the caller's
/// belief ends before the caller hears of it. Shared by
/// `Leadership::txn_if_leader` and `ShardMap::txn_if_owner`.
pub(crate) fn fenced_answer(
    response: sm::Response,
    refused: impl FnOnce(),
) -> Result<Option<Vec<TxnOpResponse>>> {
    match response {
        sm::Response::Txn {
            succeeded: true,
            responses,
            ..
        } => Ok(Some(
            responses.into_iter().map(TxnOpResponse::from_sm).collect(),
        )),
        sm::Response::Txn {
            succeeded: false, ..
        } => {
            refused();
            Ok(None)
        }
        other => Err(Error::unexpected(other)),
    }
}

/// A key with its value and metadata, as etcd stores it.
///
/// `#[non_exhaustive]`: etcd reports more metadata than is exposed here, and
/// more may be added. Built only by fleetcoord; the fields are for reading.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Revision at which the key was last created (a delete and a new put
    /// give a new one).
    pub create_revision: i64,
    /// Revision of the key's last modification.
    pub mod_revision: i64,
    /// Number of modifications since the key was created, counting from 1.
    pub version: i64,
    /// The lease the key is bound to, 0 for none.
    pub lease: i64,
}

// Conversions from the machines' vocabulary are crate-private functions,
// not `From` impls: a public trait impl would name the `fleetcoord_sm` type
// in fleetcoord's API (`make lint` checks that none does).
impl KeyValue {
    pub(crate) fn from_sm(kv: sm::KeyValue) -> Self {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

/// The result of one [`TxnOp`], in the order the ops were given.
///
/// `#[non_exhaustive]`: a new kind of op brings a new kind of result. Each
/// op has exactly one result variant, so a wildcard arm only ever sees
/// results of ops your code does not send.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxnOpResponse {
    /// A [`TxnOp::put`] or [`TxnOp::put_with_lease`] was applied.
    Put,
    /// What a [`TxnOp::get`] or [`TxnOp::get_prefix`] read, in key order;
    /// empty when nothing matched.
    Get {
        /// The keys read.
        kvs: Vec<KeyValue>,
    },
    /// What a [`TxnOp::delete`] or [`TxnOp::delete_prefix`] removed.
    Delete {
        /// How many keys were deleted.
        deleted: u64,
    },
}

impl TxnOpResponse {
    pub(crate) fn from_sm(r: sm::TxnOpResponse) -> Self {
        match r {
            sm::TxnOpResponse::Put => TxnOpResponse::Put,
            sm::TxnOpResponse::Range { kvs } => TxnOpResponse::Get {
                kvs: kvs.into_iter().map(KeyValue::from_sm).collect(),
            },
            sm::TxnOpResponse::Delete { deleted } => TxnOpResponse::Delete {
                // etcd counts in an i64 that is never negative.
                deleted: u64::try_from(deleted).unwrap_or(0),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_keys_and_prefixes_are_refused() {
        for op in [
            TxnOp::put("", "v"),
            TxnOp::get(""),
            TxnOp::get_prefix(""),
            TxnOp::delete(""),
            TxnOp::delete_prefix(""),
        ] {
            assert!(matches!(
                check_ops([op]),
                Err(Error::InvalidArgument { what: "ops", .. })
            ));
        }
    }

    #[test]
    fn oversized_transactions_are_refused() {
        let big = vec![b'x'; validate::MAX_PAYLOAD / 2 + 1];
        let ops = [TxnOp::put("a", big.clone()), TxnOp::put("b", big)];
        assert!(matches!(
            check_ops(ops),
            Err(Error::InvalidArgument { what: "ops", .. })
        ));
    }

    #[test]
    fn ops_map_to_the_machine_vocabulary() {
        let ops = check_ops([
            TxnOp::put_with_lease("k", b"v".as_slice(), 7),
            TxnOp::get_prefix("p/"),
            TxnOp::delete("k"),
        ])
        .expect("valid ops");
        assert_eq!(
            ops,
            vec![
                sm::TxnOp::Put {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    lease: 7,
                },
                sm::TxnOp::Range(sm::RangeRequest::all(sm::KeyRange::Prefix(b"p/".to_vec()))),
                sm::TxnOp::Delete(sm::KeyRange::Key(b"k".to_vec())),
            ]
        );
    }

    #[test]
    fn results_map_from_the_machine_vocabulary() {
        let kv = sm::KeyValue {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            create_revision: 3,
            mod_revision: 5,
            version: 2,
            lease: 9,
        };
        assert_eq!(
            TxnOpResponse::from_sm(sm::TxnOpResponse::Range { kvs: vec![kv] }),
            TxnOpResponse::Get {
                kvs: vec![KeyValue {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    create_revision: 3,
                    mod_revision: 5,
                    version: 2,
                    lease: 9,
                }]
            }
        );
        assert_eq!(
            TxnOpResponse::from_sm(sm::TxnOpResponse::Put),
            TxnOpResponse::Put
        );
        assert_eq!(
            TxnOpResponse::from_sm(sm::TxnOpResponse::Delete { deleted: 4 }),
            TxnOpResponse::Delete { deleted: 4 }
        );
        // etcd never counts below zero; a corrupt count must not wrap.
        assert_eq!(
            TxnOpResponse::from_sm(sm::TxnOpResponse::Delete { deleted: -1 }),
            TxnOpResponse::Delete { deleted: 0 }
        );
    }
}
