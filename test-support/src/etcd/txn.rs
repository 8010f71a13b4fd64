//! Transactions of the model etcd: guards, branches and etcd's checks on
//! them. A transaction writes at most one revision, however many puts and
//! deletes its branch holds, and a rejected one writes nothing.

use super::ModelEtcd;
use fleetcoord_sm::{Compare, Response, RpcError, Txn, TxnOp, TxnOpResponse};

/// etcd's limit on the operations of one transaction (per list).
pub const MAX_TXN_OPS: usize = 128;

impl ModelEtcd {
    /// `Request::Txn`: every check first, so a rejected transaction writes
    /// nothing; then the branch, all at one revision.
    pub(super) fn txn(&mut self, txn: &Txn) -> Result<Response, RpcError> {
        if txn.compare.len() > MAX_TXN_OPS {
            return Err(RpcError::Rejected(
                "too many operations in txn request".into(),
            ));
        }
        check_branch(&txn.success)?;
        check_branch(&txn.failure)?;
        let succeeded = txn.compare.iter().all(|c| self.holds(c));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        for op in ops {
            if let TxnOp::Put { lease, .. } = op {
                self.check_lease(*lease)?;
            }
        }
        let revision = self.revision + 1;
        let mut wrote = false;
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                TxnOp::Put { key, value, lease } => {
                    self.apply_put(revision, key, value, *lease);
                    wrote = true;
                    responses.push(TxnOpResponse::Put);
                }
                TxnOp::Range(r) => responses.push(TxnOpResponse::Range { kvs: self.read(r) }),
                TxnOp::Delete(range) => {
                    let deleted = self.apply_delete(revision, range);
                    wrote |= deleted > 0;
                    responses.push(TxnOpResponse::Delete { deleted });
                }
            }
        }
        if wrote {
            self.revision = revision;
        }
        Ok(Response::Txn {
            revision: self.revision,
            succeeded,
            responses,
        })
    }

    /// Whether one guard holds now; an absent key has revisions 0.
    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::CreateRevisionEquals { key, revision } => {
                self.kvs.get(key).map_or(0, |kv| kv.create_revision) == *revision
            }
            Compare::ModRevisionEquals { key, revision } => {
                self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *revision
            }
            // etcd fails a value compare on a missing key.
            Compare::ValueEquals { key, value } => {
                self.kvs.get(key).is_some_and(|kv| kv.value == *value)
            }
        }
    }
}

/// etcd's `checkIntervals`: no two puts of one key, no delete covering a put,
/// at most [`MAX_TXN_OPS`] operations.
fn check_branch(ops: &[TxnOp]) -> Result<(), RpcError> {
    if ops.len() > MAX_TXN_OPS {
        return Err(RpcError::Rejected(
            "too many operations in txn request".into(),
        ));
    }
    // No protocol reads an old revision inside a transaction, so the model
    // does not serve it rather than serve it wrong.
    if ops
        .iter()
        .any(|op| matches!(op, TxnOp::Range(r) if r.revision != 0))
    {
        return Err(RpcError::Rejected(
            "model etcd: a range at a revision inside a txn is not modelled".into(),
        ));
    }
    let puts: Vec<&[u8]> = ops
        .iter()
        .filter_map(|op| match op {
            TxnOp::Put { key, .. } => Some(key.as_slice()),
            _ => None,
        })
        .collect();
    let duplicate_put = puts.iter().enumerate().any(|(i, a)| puts[..i].contains(a));
    let deleted_put = ops.iter().any(|op| match op {
        TxnOp::Delete(range) => puts.iter().any(|key| range.contains(key)),
        _ => false,
    });
    if duplicate_put || deleted_put {
        return Err(RpcError::Rejected(
            "duplicate key given in txn request".into(),
        ));
    }
    Ok(())
}
