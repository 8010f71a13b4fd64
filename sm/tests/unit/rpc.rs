//! The error vocabulary's policy: what each variant lets a machine do.

use fleetcoord_sm::RpcError;

#[test]
fn each_variant_says_whether_to_resend_and_whether_it_was_applied() {
    // (error, retryable, refused by etcd so certainly not applied)
    let cases = [
        (RpcError::Unavailable("stream broke".into()), true, false),
        (
            RpcError::Unauthenticated("etcdserver: invalid auth token".into()),
            true,
            true,
        ),
        (
            RpcError::Rejected("etcdserver: request is too large".into()),
            false,
            true,
        ),
        (RpcError::LeaseNotFound, false, true),
        (
            RpcError::Compacted {
                compact_revision: 3,
            },
            false,
            true,
        ),
        (
            RpcError::PermissionDenied("etcdserver: permission denied".into()),
            false,
            true,
        ),
    ];
    for (error, retryable, refusal) in cases {
        assert_eq!(error.is_retryable(), retryable, "{error:?}");
        assert_eq!(error.is_refusal(), refusal, "{error:?}");
    }
}

#[test]
fn messages_are_etcds_own_or_say_what_happened() {
    assert_eq!(
        RpcError::PermissionDenied("etcdserver: permission denied".into()).to_string(),
        "etcdserver: permission denied"
    );
    assert_eq!(RpcError::LeaseNotFound.to_string(), "lease not found");
    assert_eq!(
        RpcError::Compacted {
            compact_revision: 0
        }
        .to_string(),
        "the requested revision has been compacted"
    );
    assert_eq!(
        RpcError::Compacted {
            compact_revision: 12
        }
        .to_string(),
        "the requested revision has been compacted (compaction revision 12)"
    );
}

#[test]
fn only_reads_may_be_sent_twice() {
    use fleetcoord_sm::{KeyRange, RangeRequest, Request, Txn, TxnOp};
    let range = || RangeRequest {
        range: KeyRange::Key(b"k".to_vec()),
        sort: fleetcoord_sm::SortOrder::Key,
        limit: 0,
        max_create_revision: 0,
        revision: 0,
        keys_only: false,
    };
    let put = || TxnOp::Put {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: 0,
    };
    let txn = |success: Vec<TxnOp>, failure: Vec<TxnOp>| {
        Request::Txn(Txn {
            compare: vec![],
            success,
            failure,
        })
    };
    for read in [
        Request::Range(range()),
        Request::LeaseTimeToLive { lease: 1 },
        txn(vec![TxnOp::Range(range())], vec![TxnOp::Range(range())]),
        txn(vec![], vec![]),
    ] {
        assert!(read.is_read_only(), "{read:?}");
    }
    for write in [
        Request::Grant { ttl_secs: 5 },
        Request::Revoke { lease: 1 },
        Request::KeepAlive { lease: 1 },
        Request::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            lease: 0,
        },
        Request::Delete(KeyRange::Key(b"k".to_vec())),
        // A write in either branch makes the whole transaction a write.
        txn(vec![TxnOp::Range(range())], vec![put()]),
        txn(vec![put()], vec![]),
        txn(vec![], vec![TxnOp::Delete(KeyRange::Key(b"k".to_vec()))]),
        Request::Watch {
            range: KeyRange::Prefix(b"p".to_vec()),
            start_revision: 1,
        },
    ] {
        assert!(!write.is_read_only(), "{write:?}");
    }
}
