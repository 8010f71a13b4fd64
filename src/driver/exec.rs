//! Executes one `fleetcoord_sm::Request` against etcd and converts the
//! answer back, and holds the conversions the runner's watch streams and
//! the renewer's keepalive stream use (`rpc_error`, `watch_response`); the
//! renewer reads a keepalive reply's lease and TTL itself. No protocol
//! decisions here; those live in `sm`. The driver (`src/driver/`) is the
//! only library code that names etcd-client (besides the test servers'
//! administration, `src/testing/admin.rs`, behind the `testing` feature).

use etcd_client as ec;
use fleetcoord_sm::rpc::prefix_end;
use fleetcoord_sm::{
    Compare, EventKind, KeyRange, KeyValue, RangeRequest, Request, Response, RpcError, SortOrder,
    Txn, TxnOp, TxnOpResponse, WatchEvent,
};
use tonic::Code;

/// The one place an etcd-client error becomes an [`RpcError`], the typed
/// vocabulary machines and the facade branch on.
///
/// The gRPC status code decides. Where etcd uses one code for several
/// errors that callers must tell apart, the status message is compared
/// with the text of etcd's own error constant (`rpctypes` in
/// etcd's `api/v3rpc/rpctypes/error.go`, stable since etcd 3.0); such
/// comparisons exist here and in [`super::connect`], which tells a missing
/// login (`ErrGRPCUserEmpty`) from a failed one (and reads rustls's words to
/// say which TLS check failed).
pub(crate) fn rpc_error(err: ec::Error) -> RpcError {
    match err {
        ec::Error::GRpcStatus(status) => status_error(&status),
        ec::Error::InvalidArgs(msg) => RpcError::Rejected(msg),
        // etcd-client reports a keepalive stream whose opening renewal got
        // a TTL of 0 with this exact text (`LeaseClient::keep_alive` in
        // etcd-client's `rpc/lease.rs`); its other `LeaseKeepAliveError`s
        // are a closed local channel, i.e. a broken stream.
        ec::Error::LeaseKeepAliveError(msg) if msg == EC_KEEPALIVE_TTL_ZERO => {
            RpcError::LeaseNotFound
        }
        other => RpcError::Unavailable(other.to_string()),
    }
}

/// etcd's `ErrGRPCCompacted` (code `OutOfRange`, which it shares with
/// `ErrGRPCFutureRev` and `ErrGRPCLeaseTTLTooLarge`).
const ETCD_COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// etcd's `ErrGRPCNoSpace` (code `ResourceExhausted`, which it shares with
/// `ErrGRPCTooManyRequests` and gRPC's own message-size limits).
const ETCD_NOSPACE: &str = "etcdserver: mvcc: database space exceeded";

/// tonic's whole message for a request whose connection broke.
const TONIC_TRANSPORT_ERROR: &str = "transport error";

/// What a request whose connection broke says instead of tonic's words.
const BROKE: &str =
    "the connection to etcd broke before it answered (a write may have been applied)";

/// What etcd-client 0.21 says when a keepalive stream opens on a lease etcd
/// no longer has.
const EC_KEEPALIVE_TTL_ZERO: &str = "lease not found";

fn status_error(status: &tonic::Status) -> RpcError {
    let message = status.message();
    match status.code() {
        // etcd's only NotFound on the KV and Lease services is
        // `ErrGRPCLeaseNotFound` ("etcdserver: requested lease not found");
        // `ErrGRPCMemberNotFound` belongs to the Cluster service, which no
        // request here calls.
        Code::NotFound => RpcError::LeaseNotFound,
        Code::OutOfRange if message == ETCD_COMPACTED => RpcError::Compacted {
            compact_revision: 0,
        },
        // `ErrGRPCPermissionDenied`.
        Code::PermissionDenied => RpcError::PermissionDenied(message.to_string()),
        // `ErrGRPCInvalidAuthToken`: the token expired or was invalidated.
        Code::Unauthenticated => RpcError::Unauthenticated(message.to_string()),
        Code::ResourceExhausted if message == ETCD_NOSPACE => {
            RpcError::NoSpace(message.to_string())
        }
        // Bad arguments, a request or answer too large, too many
        // operations, a future revision, a lease TTL too large, not
        // supported: the same request fails the same way.
        Code::InvalidArgument
        | Code::AlreadyExists
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::ResourceExhausted => RpcError::Rejected(message.to_string()),
        // No connection, no leader, leader changed, timed out, canceled, a
        // transport failure (`Unknown`, `Internal`): the request may work
        // later. tonic's message for a broken connection is a bare
        // "transport error" (code `Unknown`), which says neither that the
        // connection broke nor that etcd may have applied the request: say
        // both, whatever the code, then what broke (the cause chain).
        code => {
            let head = if message == TONIC_TRANSPORT_ERROR {
                BROKE.to_string()
            } else {
                format!("{code:?}: {message}")
            };
            RpcError::Unavailable(match causes(status) {
                causes if causes.is_empty() => head,
                causes => format!("{head}: {causes}"),
            })
        }
    }
}

/// The distinct messages of `status`'s cause chain, outermost first,
/// joined with ": " (hyper and h2 often repeat their cause's text in their
/// own); empty when it has none.
fn causes(status: &tonic::Status) -> String {
    let mut seen: Vec<String> = vec![status.message().to_string()];
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        let text = e.to_string();
        if !text.is_empty() && !seen.iter().any(|s| s.contains(&text)) {
            seen.push(text);
        }
        cause = e.source();
    }
    seen[1..].join(": ")
}

/// Whether a call failed before reaching any etcd member: the client's
/// balancer picked a member whose TCP connect was refused. Nothing was sent,
/// so any request — writes included — can be tried again at once.
///
/// With several endpoints, etcd-client's balancer keeps handing some calls
/// to a member that is down (etcdv3/etcd-client#39); without this, a third
/// of all calls fail while one of three members is dead.
///
/// The status code alone cannot say it: `Unavailable` also means "sent, and
/// the connection broke", after which a write may have been applied. The
/// status's cause can: tonic keeps the connector's error as its source, and
/// at the root of that chain is the OS error of the `connect` call. Only a
/// connect fails with these kinds, and they fail at once (a connect that
/// times out is not retried here; the request's own deadline covers it).
pub(crate) fn is_connect_failure(err: &ec::Error) -> bool {
    match err {
        ec::Error::TransportError(_) => true,
        ec::Error::GRpcStatus(status) => {
            status.code() == Code::Unavailable && connect_refused(status)
        }
        _ => false,
    }
}

fn connect_refused(status: &tonic::Status) -> bool {
    use std::io::ErrorKind;
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
            );
        }
        cause = e.source();
    }
    false
}

/// How often a call that failed to connect is tried again (each failure is
/// immediate): enough that picking the dead member of three every time is
/// vanishingly rare.
pub(crate) const CONNECT_ATTEMPTS: u32 = 12;

/// The largest watch response a watch stream accepts: what etcd's gRPC
/// server may send (`maxSendBytes = math.MaxInt32` in its v3rpc). All of a
/// revision's events travel in one response (etcd fragments only on a
/// request etcd-client cannot make), so one transaction of a few large
/// values exceeds tonic's default of 4 MiB, and so does a watch catching
/// up after a reconnect (up to 1,000 revisions a response). Refused, that
/// response would end the watch and force a re-read of the whole prefix,
/// folding the events it held into a diff. Range answers keep the
/// default: their pages halve instead.
pub(crate) const WATCH_RESPONSE_LIMIT: usize = i32::MAX as usize;

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

/// [`key_value`], moving the key and value out instead of copying them.
fn owned_key_value(kv: ec::KeyValue) -> KeyValue {
    let (create_revision, mod_revision, version, lease) = (
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease(),
    );
    let (key, value) = kv.into_key_value();
    KeyValue {
        key,
        value,
        create_revision,
        mod_revision,
        version,
        lease,
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
        KeyRange::PrefixSpan { to, .. } => options = options.with_range(to.clone()),
    }
    if range.limit > 0 {
        options = options.with_limit(range.limit);
    }
    if range.max_create_revision > 0 {
        options = options.with_max_create_revision(range.max_create_revision);
    }
    if range.revision > 0 {
        options = options.with_revision(range.revision);
    }
    if range.keys_only {
        options = options.with_keys_only();
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
        KeyRange::PrefixFrom { from, .. } | KeyRange::PrefixSpan { from, .. } => from.clone(),
    }
}

fn delete_options(range: &KeyRange) -> ec::DeleteOptions {
    match range {
        KeyRange::Key(_) => ec::DeleteOptions::new(),
        KeyRange::Prefix(_) => ec::DeleteOptions::new().with_prefix(),
        KeyRange::PrefixFrom { prefix, .. } => {
            ec::DeleteOptions::new().with_range(prefix_end(prefix))
        }
        KeyRange::PrefixSpan { to, .. } => ec::DeleteOptions::new().with_range(to.clone()),
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
        Compare::ValueEquals { key, value } => {
            ec::Compare::value(key.clone(), ec::CompareOp::Equal, value.clone())
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
/// streams handled by the runner), recording its round trip.
pub(crate) async fn unary(
    client: &mut ec::Client,
    request: &Request,
) -> Result<Response, RpcError> {
    let started = std::time::Instant::now();
    let result = unary_call(client, request).await;
    crate::metrics::request(crate::metrics::kind(request), started.elapsed(), &result);
    result
}

async fn unary_call(client: &mut ec::Client, request: &Request) -> Result<Response, RpcError> {
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
            let mut r = on_a_live_member!(
                client
                    .get(range_key(&range.range), Some(get_options(range)))
                    .await
            )
            .map_err(rpc_error)?;
            // Moved out, not copied: a snapshot page is up to a thousand
            // keys and values.
            Ok(Response::Range {
                revision: header_revision(r.header()),
                kvs: r.take_kvs().into_iter().map(owned_key_value).collect(),
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
        KeyRange::PrefixSpan { to, .. } => options = options.with_range(to.clone()),
    }
    (range_key(range), options)
}

/// The error a cancelled watch stands for, when etcd refused it rather than
/// ended it: a watch on a prefix the user may not read, or opened with an
/// expired token, returns Ok and its first response is `created && canceled`
/// with a `cancel_reason` (docs/etcd-notes.md, "Auth", "Token expiry"). Read
/// as a plain cancellation it would be re-opened forever; as the error it is,
/// the machine's permanent-error path reaches the user.
///
/// etcd writes the reason as Go's gRPC status text, `rpc error: code =
/// <Code> desc = <message>`; the code and message are mapped like any
/// status. A cancellation for compaction, or with a reason in any other
/// shape, is not a refusal.
pub(crate) fn watch_refusal(r: &ec::WatchResponse) -> Option<RpcError> {
    if !r.canceled() || r.compact_revision() > 0 {
        return None;
    }
    refusal_from_reason(r.cancel_reason())
}

fn refusal_from_reason(reason: &str) -> Option<RpcError> {
    let rest = reason.split_once("code = ")?.1;
    let (code, message) = rest.split_once(" desc = ")?;
    let code = match code.trim() {
        "PermissionDenied" => Code::PermissionDenied,
        "Unauthenticated" => Code::Unauthenticated,
        "InvalidArgument" => Code::InvalidArgument,
        "FailedPrecondition" => Code::FailedPrecondition,
        "ResourceExhausted" => Code::ResourceExhausted,
        _ => return None,
    };
    Some(status_error(&tonic::Status::new(code, message.trim())))
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    fn grpc(code: Code, message: &str) -> RpcError {
        rpc_error(ec::Error::GRpcStatus(Status::new(code, message)))
    }

    fn rejected(message: &str) -> RpcError {
        RpcError::Rejected(message.into())
    }

    /// The statuses etcd sends (its `rpctypes` constants) and the transport
    /// failures tonic reports, each with the variant machines branch on.
    #[test]
    fn a_transport_error_says_what_broke() {
        let mut status = tonic::Status::new(Code::Unknown, "transport error");
        let reset = std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        );
        status.set_source(std::sync::Arc::new(reset));
        assert_eq!(
            rpc_error(ec::Error::GRpcStatus(status)),
            RpcError::Unavailable(format!("{BROKE}: connection reset by peer"))
        );
        // Without a cause the status says all there is.
        assert_eq!(
            status_error(&tonic::Status::new(Code::Unavailable, "no leader")),
            RpcError::Unavailable("Unavailable: no leader".into())
        );
    }

    #[test]
    fn statuses_map_by_code() {
        let cases = [
            (
                Code::NotFound,
                "etcdserver: requested lease not found",
                RpcError::LeaseNotFound,
            ),
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
                RpcError::Compacted {
                    compact_revision: 0,
                },
            ),
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
                rejected("etcdserver: mvcc: required revision is a future revision"),
            ),
            (
                Code::OutOfRange,
                "etcdserver: too large lease TTL",
                rejected("etcdserver: too large lease TTL"),
            ),
            // tonic's own refusal of an answer over the client's 4 MiB
            // limit; the stream reader halves its page on `Rejected`.
            (
                Code::OutOfRange,
                "Error, decoded message length too large: found 5242880 bytes, \
                 the limit is: 4194304 bytes",
                rejected(
                    "Error, decoded message length too large: found 5242880 bytes, \
                     the limit is: 4194304 bytes",
                ),
            ),
            (
                Code::PermissionDenied,
                "etcdserver: permission denied",
                RpcError::PermissionDenied("etcdserver: permission denied".into()),
            ),
            (
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
                RpcError::Unauthenticated("etcdserver: invalid auth token".into()),
            ),
            (
                Code::InvalidArgument,
                "etcdserver: request is too large",
                rejected("etcdserver: request is too large"),
            ),
            (
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
                rejected("etcdserver: duplicate key given in txn request"),
            ),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
                rejected("etcdserver: authentication failed, invalid user ID or password"),
            ),
            (
                Code::InvalidArgument,
                "etcdserver: user name is empty",
                rejected("etcdserver: user name is empty"),
            ),
            (
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
                RpcError::NoSpace("etcdserver: mvcc: database space exceeded".into()),
            ),
            // The same code, another of etcd's errors: not the space alarm.
            (
                Code::ResourceExhausted,
                "etcdserver: too many requests",
                rejected("etcdserver: too many requests"),
            ),
            (
                Code::FailedPrecondition,
                "etcdserver: lease already exists",
                rejected("etcdserver: lease already exists"),
            ),
            (
                Code::Unavailable,
                "etcdserver: leader changed",
                RpcError::Unavailable("Unavailable: etcdserver: leader changed".into()),
            ),
            (
                Code::Unavailable,
                "etcdserver: no leader",
                RpcError::Unavailable("Unavailable: etcdserver: no leader".into()),
            ),
            (
                Code::Unavailable,
                "etcdserver: request timed out",
                RpcError::Unavailable("Unavailable: etcdserver: request timed out".into()),
            ),
            (
                Code::DeadlineExceeded,
                "context deadline exceeded",
                RpcError::Unavailable("DeadlineExceeded: context deadline exceeded".into()),
            ),
            (
                Code::Cancelled,
                "operation was canceled",
                RpcError::Unavailable("Cancelled: operation was canceled".into()),
            ),
            (
                Code::Unknown,
                "transport error",
                RpcError::Unavailable(BROKE.into()),
            ),
        ];
        for (code, message, expected) in cases {
            assert_eq!(grpc(code, message), expected, "{code:?} {message:?}");
        }
    }

    #[test]
    fn refused_watches_become_errors() {
        assert_eq!(
            refusal_from_reason(
                "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
            ),
            Some(RpcError::PermissionDenied(
                "etcdserver: permission denied".into()
            ))
        );
        assert_eq!(
            refusal_from_reason(
                "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
            ),
            Some(RpcError::Unauthenticated(
                "etcdserver: invalid auth token".into()
            ))
        );
        assert_eq!(
            refusal_from_reason(
                "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"
            ),
            Some(rejected("etcdserver: user name is empty"))
        );
        // Anything else stays a cancellation the machine recovers from.
        for reason in [
            "",
            "watch closed",
            "rpc error: code = Unavailable desc = etcdserver: no leader",
            "rpc error: code = PermissionDenied",
        ] {
            assert_eq!(refusal_from_reason(reason), None, "{reason:?}");
        }
    }

    #[test]
    fn the_code_decides_not_the_text() {
        // A NotFound is a missing lease whatever it says; a message that
        // merely mentions a lease does not make one.
        assert_eq!(grpc(Code::NotFound, ""), RpcError::LeaseNotFound);
        assert_eq!(
            grpc(Code::InvalidArgument, "requested lease not found"),
            rejected("requested lease not found")
        );
        assert_eq!(
            grpc(Code::Unavailable, "required revision has been compacted"),
            RpcError::Unavailable("Unavailable: required revision has been compacted".into())
        );
    }

    #[test]
    fn client_side_errors() {
        assert_eq!(
            rpc_error(ec::Error::InvalidArgs("key is empty".into())),
            rejected("key is empty")
        );
        assert_eq!(
            rpc_error(ec::Error::LeaseKeepAliveError("lease not found".into())),
            RpcError::LeaseNotFound
        );
        // The renewal channel closed: the stream is broken, nothing more.
        assert_eq!(
            rpc_error(ec::Error::LeaseKeepAliveError("channel closed".into())),
            RpcError::Unavailable("lease keep alive error: channel closed".into())
        );
        assert_eq!(
            rpc_error(ec::Error::WatchError(
                "failed to create lease keeper".into()
            )),
            RpcError::Unavailable("watch error: failed to create lease keeper".into())
        );
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn only_a_refused_connect_counts_as_a_connect_failure() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("addr").port()
        };
        let refused = runtime().block_on(async {
            let mut client = ec::Client::connect([format!("http://127.0.0.1:{port}")], None)
                .await
                .expect("lazy connect");
            client.get("k", None).await.expect_err("nobody listens")
        });
        assert!(is_connect_failure(&refused), "{refused:?}");
        assert!(matches!(rpc_error(refused), RpcError::Unavailable(_)));
        // The same words without the OS error behind them prove nothing:
        // the request may have been sent.
        for status in [
            Status::new(Code::Unavailable, "tcp connect error"),
            Status::new(Code::Unavailable, "etcdserver: leader changed"),
            Status::new(Code::InvalidArgument, "tcp connect error"),
        ] {
            assert!(!is_connect_failure(&ec::Error::GRpcStatus(status)));
        }
    }

    /// What a real etcd answers, through the same mapping.
    #[cfg(feature = "testing")]
    mod against_etcd {
        use super::*;
        use crate::testing::{EtcdBuilder, EtcdServer};

        const MISSING_LEASE: i64 = 0x0bad_1ea5e;

        #[test]
        fn leases_revisions_and_limits() {
            let server = EtcdServer::start().expect("etcd");
            runtime().block_on(async {
                let mut client = ec::Client::connect([server.endpoint()], None)
                    .await
                    .expect("connect");
                for request in [
                    Request::Revoke {
                        lease: MISSING_LEASE,
                    },
                    Request::Put {
                        key: b"k".to_vec(),
                        value: Vec::new(),
                        lease: MISSING_LEASE,
                    },
                ] {
                    assert_eq!(
                        unary(&mut client, &request).await,
                        Err(RpcError::LeaseNotFound),
                        "{request:?}"
                    );
                }
                let opened = client.lease_keep_alive(MISSING_LEASE).await;
                assert_eq!(
                    opened.map(|_| ()).map_err(rpc_error),
                    Err(RpcError::LeaseNotFound)
                );

                let first = client.put("k", "1", None).await.expect("put");
                let old = first.header().expect("header").revision();
                let second = client.put("k", "2", None).await.expect("put");
                let now = second.header().expect("header").revision();
                client.compact(now, None).await.expect("compact");
                let at = |revision| Some(ec::GetOptions::new().with_revision(revision));
                assert_eq!(
                    client
                        .get("k", at(old))
                        .await
                        .map(|_| ())
                        .map_err(rpc_error),
                    Err(RpcError::Compacted {
                        compact_revision: 0
                    })
                );
                assert!(matches!(
                    client.get("k", at(now + 100)).await.map_err(rpc_error),
                    Err(RpcError::Rejected(_))
                ));
                assert!(matches!(
                    unary(&mut client, &Request::Grant { ttl_secs: i64::MAX }).await,
                    Err(RpcError::Rejected(_))
                ));
                let too_large = Request::Put {
                    key: b"k".to_vec(),
                    value: vec![0; 2 << 20],
                    lease: 0,
                };
                assert!(matches!(
                    unary(&mut client, &too_large).await,
                    Err(RpcError::Rejected(_))
                ));
            });
        }

        #[test]
        fn permission_denied_and_an_expired_token() {
            // Simple tokens expire after two idle seconds (checked once a
            // second); each use restarts the clock.
            let server = EtcdBuilder::new()
                .arg("--auth-token-ttl=2")
                .start()
                .expect("etcd");
            runtime().block_on(async {
                let mut admin = ec::Client::connect([server.endpoint()], None)
                    .await
                    .expect("connect");
                admin.user_add("root", "root-pw", None).await.expect("root");
                admin
                    .user_grant_role("root", "root")
                    .await
                    .expect("root role");
                admin.role_add("coord").await.expect("role");
                let mine = ec::Permission::read_write("/coord/").with_prefix();
                admin
                    .role_grant_permission("coord", mine)
                    .await
                    .expect("grant");
                admin
                    .user_add("agent", "agent-pw", None)
                    .await
                    .expect("user");
                admin
                    .user_grant_role("agent", "coord")
                    .await
                    .expect("user role");
                admin.auth_enable().await.expect("auth on");

                let options = ec::ConnectOptions::new().with_user("agent", "agent-pw");
                let mut agent = ec::Client::connect([server.endpoint()], Some(options))
                    .await
                    .expect("log in");
                let put = |key: &str| Request::Put {
                    key: key.as_bytes().to_vec(),
                    value: Vec::new(),
                    lease: 0,
                };
                unary(&mut agent, &put("/coord/x"))
                    .await
                    .expect("inside the grant");
                assert_eq!(
                    unary(&mut agent, &put("/elsewhere")).await,
                    Err(RpcError::PermissionDenied(
                        "etcdserver: permission denied".into()
                    ))
                );
                // Without a token refresh (etcd-client's
                // `with_auto_token_refresh`, off here), the first call after
                // expiry is refused.
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                assert_eq!(
                    unary(&mut agent, &put("/coord/x")).await,
                    Err(RpcError::Unauthenticated(
                        "etcdserver: invalid auth token".into()
                    ))
                );
            });
        }
    }
}

#[cfg(test)]
mod unary_tests {
    use super::*;
    use fleetcoord_sm::rpc::RangeRequest;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Streams have their own paths in the driver; a unary call of one is a
    /// driver bug, refused without sending anything (nobody listens here).
    #[test]
    fn streaming_requests_are_refused_as_unary_calls() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("addr").port()
        };
        runtime().block_on(async {
            let mut client = ec::Client::connect([format!("http://127.0.0.1:{port}")], None)
                .await
                .expect("lazy connect");
            for request in [
                Request::Watch {
                    range: KeyRange::Prefix(b"p/".to_vec()),
                    start_revision: 1,
                },
                Request::KeepAlive { lease: 7 },
            ] {
                assert_eq!(
                    unary(&mut client, &request).await,
                    Err(RpcError::Rejected("streaming request sent as unary".into())),
                    "{request:?}"
                );
            }
        });
    }

    /// A `PrefixFrom` range means `[from, end of prefix)` for every kind of
    /// request, checked on a real etcd.
    #[cfg(feature = "testing")]
    #[test]
    fn a_prefix_from_range_starts_at_from_and_stays_in_the_prefix() {
        use crate::testing::EtcdServer;
        let server = EtcdServer::start().expect("etcd");
        runtime().block_on(async {
            let mut client = ec::Client::connect([server.endpoint()], None)
                .await
                .expect("connect");
            for key in ["p/a", "p/b", "p/c", "q"] {
                client.put(key, "v", None).await.expect("put");
            }
            let from = || KeyRange::PrefixFrom {
                prefix: b"p/".to_vec(),
                from: b"p/b".to_vec(),
            };
            let keys = |response: Result<Response, RpcError>| match response {
                Ok(Response::Range { kvs, .. }) => kvs
                    .into_iter()
                    .map(|kv| String::from_utf8(kv.key).expect("utf-8"))
                    .collect::<Vec<_>>(),
                other => panic!("not a range: {other:?}"),
            };
            let read = Request::Range(RangeRequest::all(from()));
            assert_eq!(keys(unary(&mut client, &read).await), ["p/b", "p/c"]);
            assert_eq!(
                unary(&mut client, &Request::Delete(from())).await,
                Ok(Response::Deleted {
                    revision: 6,
                    deleted: 2
                })
            );
            let everything = client
                .get("", Some(ec::GetOptions::new().with_all_keys()))
                .await
                .expect("get");
            let left: Vec<&str> = everything
                .kvs()
                .iter()
                .map(|kv| kv.key_str().expect("utf-8"))
                .collect();
            assert_eq!(left, ["p/a", "q"]);
        });
    }
}
