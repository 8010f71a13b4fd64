//! Executes one `fleetcoord_sm::Request` against etcd and converts the
//! answer back: the only place that knows both vocabularies. No protocol
//! decisions here; those live in `sm`.

use etcd_client as ec;
use fleetcoord_sm::rpc::prefix_end;
use fleetcoord_sm::{
    Compare, EventKind, KeyRange, KeyValue, RangeRequest, Request, Response, RpcError, SortOrder,
    Txn, TxnOp, TxnOpResponse, WatchEvent,
};
use tonic::Code;

/// Map an etcd-client error onto the two outcomes machines distinguish:
/// worth retrying (`Unavailable`) or not (`Rejected`).
pub(crate) fn rpc_error(err: ec::Error) -> RpcError {
    match &err {
        ec::Error::GRpcStatus(status) => match status.code() {
            Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Unauthenticated
            | Code::ResourceExhausted => RpcError::Rejected(status.message().to_string()),
            code => RpcError::Unavailable(format!("{code:?}: {}", status.message())),
        },
        ec::Error::InvalidArgs(msg) => RpcError::Rejected(msg.clone()),
        _ => RpcError::Unavailable(err.to_string()),
    }
}

/// Whether a call failed before reaching any etcd member: the client's
/// balancer picked a member whose TCP connect was refused. Nothing was sent,
/// so any request — writes included — can be tried again at once.
///
/// With several endpoints, etcd-client's balancer keeps handing some calls
/// to a member that is down (etcdv3/etcd-client#39); without this, a third
/// of all calls fail while one of three members is dead.
pub(crate) fn is_connect_failure(err: &ec::Error) -> bool {
    match err {
        ec::Error::TransportError(_) => true,
        ec::Error::GRpcStatus(status) => {
            status.code() == Code::Unavailable
                && (status.message().starts_with("tcp connect error")
                    || status.message().starts_with("error trying to connect"))
        }
        _ => false,
    }
}

/// How often a call that failed to connect is tried again (each failure is
/// immediate): enough that picking the dead member of three every time is
/// vanishingly rare.
pub(crate) const CONNECT_ATTEMPTS: u32 = 12;

/// Evaluate an etcd-client call, again while it fails to connect (see
/// [`is_connect_failure`]).
macro_rules! on_a_live_member {
    ($call:expr) => {{
        let mut attempt = 1;
        loop {
            match $call {
                Err(e)
                    if attempt < $crate::driver::exec::CONNECT_ATTEMPTS
                        && $crate::driver::exec::is_connect_failure(&e) =>
                {
                    attempt += 1
                }
                other => break other,
            }
        }
    }};
}
pub(crate) use on_a_live_member;

pub(crate) fn key_value(kv: &ec::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn header_revision(header: Option<&ec::ResponseHeader>) -> i64 {
    header.map(|h| h.revision()).unwrap_or(0)
}

fn get_options(range: &RangeRequest) -> ec::GetOptions {
    let mut options = ec::GetOptions::new();
    match &range.range {
        KeyRange::Key(_) => {}
        KeyRange::Prefix(_) => options = options.with_prefix(),
        KeyRange::PrefixFrom { prefix, .. } => options = options.with_range(prefix_end(prefix)),
    }
    if range.limit > 0 {
        options = options.with_limit(range.limit);
    }
    if range.max_create_revision > 0 {
        options = options.with_max_create_revision(range.max_create_revision);
    }
    match range.sort {
        SortOrder::Key => {}
        SortOrder::CreateAscending => {
            options = options.with_sort(ec::SortTarget::Create, ec::SortOrder::Ascend)
        }
        SortOrder::CreateDescending => {
            options = options.with_sort(ec::SortTarget::Create, ec::SortOrder::Descend)
        }
    }
    options
}

fn range_key(range: &KeyRange) -> Vec<u8> {
    match range {
        KeyRange::Key(k) | KeyRange::Prefix(k) => k.clone(),
        KeyRange::PrefixFrom { from, .. } => from.clone(),
    }
}

fn delete_options(range: &KeyRange) -> ec::DeleteOptions {
    match range {
        KeyRange::Key(_) => ec::DeleteOptions::new(),
        KeyRange::Prefix(_) => ec::DeleteOptions::new().with_prefix(),
        KeyRange::PrefixFrom { prefix, .. } => {
            ec::DeleteOptions::new().with_range(prefix_end(prefix))
        }
    }
}

fn put_options(lease: i64) -> Option<ec::PutOptions> {
    (lease != 0).then(|| ec::PutOptions::new().with_lease(lease))
}

fn txn_op(op: &TxnOp) -> ec::TxnOp {
    match op {
        TxnOp::Put { key, value, lease } => {
            ec::TxnOp::put(key.clone(), value.clone(), put_options(*lease))
        }
        TxnOp::Range(range) => ec::TxnOp::get(range_key(&range.range), Some(get_options(range))),
        TxnOp::Delete(range) => ec::TxnOp::delete(range_key(range), Some(delete_options(range))),
    }
}

fn compare(c: &Compare) -> ec::Compare {
    match c {
        Compare::CreateRevisionEquals { key, revision } => {
            ec::Compare::create_revision(key.clone(), ec::CompareOp::Equal, *revision)
        }
        Compare::ModRevisionEquals { key, revision } => {
            ec::Compare::mod_revision(key.clone(), ec::CompareOp::Equal, *revision)
        }
    }
}

fn txn(t: &Txn) -> ec::Txn {
    ec::Txn::new()
        .when(t.compare.iter().map(compare).collect::<Vec<_>>())
        .and_then(t.success.iter().map(txn_op).collect::<Vec<_>>())
        .or_else(t.failure.iter().map(txn_op).collect::<Vec<_>>())
}

/// Run a unary request (everything but `Watch` and `KeepAlive`, which are
/// streams handled by the runner).
pub(crate) async fn unary(
    client: &mut ec::Client,
    request: &Request,
) -> Result<Response, RpcError> {
    match request {
        Request::Grant { ttl_secs } => {
            let r =
                on_a_live_member!(client.lease_grant(*ttl_secs, None).await).map_err(rpc_error)?;
            Ok(Response::Granted {
                lease: r.id(),
                ttl_secs: r.ttl(),
            })
        }
        Request::Revoke { lease } => {
            on_a_live_member!(client.lease_revoke(*lease).await).map_err(rpc_error)?;
            Ok(Response::Revoked)
        }
        Request::Put { key, value, lease } => {
            let r = on_a_live_member!(
                client
                    .put(key.clone(), value.clone(), put_options(*lease))
                    .await
            )
            .map_err(rpc_error)?;
            Ok(Response::Put {
                revision: header_revision(r.header()),
            })
        }
        Request::Range(range) => {
            let r = on_a_live_member!(
                client
                    .get(range_key(&range.range), Some(get_options(range)))
                    .await
            )
            .map_err(rpc_error)?;
            Ok(Response::Range {
                revision: header_revision(r.header()),
                kvs: r.kvs().iter().map(key_value).collect(),
            })
        }
        Request::LeaseTimeToLive { lease } => {
            let r = on_a_live_member!(client.lease_time_to_live(*lease, None).await)
                .map_err(rpc_error)?;
            Ok(Response::LeaseTimeToLive {
                ttl_secs: r.ttl(),
                granted_secs: r.granted_ttl(),
            })
        }
        Request::Delete(range) => {
            let r = on_a_live_member!(
                client
                    .delete(range_key(range), Some(delete_options(range)))
                    .await
            )
            .map_err(rpc_error)?;
            Ok(Response::Deleted {
                revision: header_revision(r.header()),
                deleted: r.deleted(),
            })
        }
        Request::Txn(t) => {
            let r = on_a_live_member!(client.txn(txn(t)).await).map_err(rpc_error)?;
            let responses = r
                .op_responses()
                .into_iter()
                .map(|op| match op {
                    ec::TxnOpResponse::Put(_) => TxnOpResponse::Put,
                    ec::TxnOpResponse::Get(g) => TxnOpResponse::Range {
                        kvs: g.kvs().iter().map(key_value).collect(),
                    },
                    ec::TxnOpResponse::Delete(d) => TxnOpResponse::Delete {
                        deleted: d.deleted(),
                    },
                    // We never send nested transactions.
                    ec::TxnOpResponse::Txn(_) => TxnOpResponse::Put,
                })
                .collect();
            Ok(Response::Txn {
                revision: header_revision(r.header()),
                succeeded: r.succeeded(),
                responses,
            })
        }
        Request::Watch { .. } | Request::KeepAlive { .. } => {
            Err(RpcError::Rejected("streaming request sent as unary".into()))
        }
    }
}

/// Options for a watch on `range` from `start_revision`, with previous values.
pub(crate) fn watch_options(range: &KeyRange, start_revision: i64) -> (Vec<u8>, ec::WatchOptions) {
    let mut options = ec::WatchOptions::new().with_prev_key();
    if start_revision > 0 {
        options = options.with_start_revision(start_revision);
    }
    match range {
        KeyRange::Key(_) => {}
        KeyRange::Prefix(_) => options = options.with_prefix(),
        KeyRange::PrefixFrom { prefix, .. } => options = options.with_range(prefix_end(prefix)),
    }
    (range_key(range), options)
}

/// Convert one etcd watch response into the sm vocabulary.
pub(crate) fn watch_response(r: &ec::WatchResponse) -> Response {
    if r.canceled() {
        return Response::WatchCanceled {
            compact_revision: r.compact_revision(),
        };
    }
    let events = r
        .events()
        .iter()
        .filter_map(|e| {
            let kv = key_value(e.kv()?);
            let kind = match e.event_type() {
                ec::EventType::Put => EventKind::Put,
                ec::EventType::Delete => EventKind::Delete,
            };
            Some(WatchEvent {
                kind,
                kv,
                prev_kv: e.prev_kv().map(key_value),
            })
        })
        .collect();
    Response::WatchEvents { events }
}
