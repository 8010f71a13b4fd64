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
