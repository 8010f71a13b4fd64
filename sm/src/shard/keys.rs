//! The shard map's key layout and the etcd requests that write it, in one
//! place so that the layout documented in the module docs of
//! [`shard`](crate::shard) is the one written.

use crate::rpc::{Compare, KeyRange, LeaseId, RangeRequest, Request, Revision, Txn, TxnOp};

/// `<prefix>members/`: the members' keys.
pub(crate) fn members_prefix(prefix: &[u8]) -> Vec<u8> {
    [prefix, b"members/"].concat()
}

/// `<prefix>shards/`: the owners' keys.
pub(crate) fn shards_prefix(prefix: &[u8]) -> Vec<u8> {
    [prefix, b"shards/"].concat()
}

/// `<prefix>members/<member>`.
pub fn member_key(prefix: &[u8], member: &[u8]) -> Vec<u8> {
    [members_prefix(prefix).as_slice(), member].concat()
}

/// `<prefix>shards/<shard in decimal>`.
pub fn shard_key(prefix: &[u8], shard: u32) -> Vec<u8> {
    [
        shards_prefix(prefix).as_slice(),
        shard.to_string().as_bytes(),
    ]
    .concat()
}

/// A member key's value: its weight in decimal ASCII.
pub(crate) fn weight_value(weight: u32) -> Vec<u8> {
    weight.to_string().into_bytes()
}

/// The weight a member key's value announces: empty means 1, decimal
/// ASCII is taken as it is (0: never placed), anything else counts as 1,
/// so a foreign writer cannot take a member out of placement by mistake.
pub fn parse_weight(value: &[u8]) -> u32 {
    if value.is_empty() {
        return 1;
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
}

/// The shard number of a shard key's suffix: canonical decimal (no sign,
/// no leading zero) below `shards`; anything else is no shard of the map.
pub fn parse_shard(suffix: &[u8], shards: u32) -> Option<u32> {
    if suffix.is_empty() || (suffix.len() > 1 && suffix[0] == b'0') {
        return None;
    }
    if !suffix.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = std::str::from_utf8(suffix).ok()?.parse::<u32>().ok()?;
    (n < shards).then_some(n)
}

/// The one read the view starts from: everything under the prefix.
pub(crate) fn read(prefix: &[u8]) -> Request {
    Request::Range(RangeRequest::all(KeyRange::Prefix(prefix.to_vec())))
}

/// The watch that follows it, from the read's revision + 1.
pub(crate) fn watch(prefix: &[u8], start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(prefix.to_vec()),
        start_revision,
    }
}

/// What a guarded write does when its guard fails: read the key, so the
/// member learns how it is now without waiting for its view (rules 3
/// and 9).
fn read_back(key: Vec<u8>) -> Vec<TxnOp> {
    vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(key)))]
}

/// Write `key = value` on `lease` if the key's mod revision is still
/// `mod_revision` (0: the key is absent): a copy that lands late applies
/// only if nothing changed since. A failed guard reads the key.
pub(crate) fn guarded_put(
    key: Vec<u8>,
    value: Vec<u8>,
    lease: LeaseId,
    mod_revision: Revision,
) -> Request {
    let compare = if mod_revision == 0 {
        Compare::CreateRevisionEquals {
            key: key.clone(),
            revision: 0,
        }
    } else {
        Compare::ModRevisionEquals {
            key: key.clone(),
            revision: mod_revision,
        }
    };
    Request::Txn(Txn {
        compare: vec![compare],
        success: vec![TxnOp::Put {
            key: key.clone(),
            value,
            lease,
        }],
        failure: read_back(key),
    })
}

/// Delete `key` only if its create revision is `create_revision`: only
/// the incarnation it names, never a successor's key. A failed guard reads
/// the key.
pub(crate) fn guarded_delete(key: Vec<u8>, create_revision: Revision) -> Request {
    Request::Txn(Txn {
        compare: vec![Compare::CreateRevisionEquals {
            key: key.clone(),
            revision: create_revision,
        }],
        success: vec![TxnOp::Delete(KeyRange::Key(key.clone()))],
        failure: read_back(key),
    })
}
