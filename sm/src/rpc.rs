//! The etcd vocabulary shared by every machine.
//!
//! Machines never talk to etcd; they emit [`Request`]s inside
//! [`Command::Rpc`] and receive [`Response`]s inside an [`RpcReply`]. The
//! driver implements this small vocabulary once, so every machine gets the
//! same, thin glue. Everything here is plain data: keys and values are bytes,
//! revisions and lease ids are etcd's `i64`s.

/// An etcd lease id. etcd never hands out 0; 0 means "no lease".
pub type LeaseId = i64;

/// An etcd revision (the store's logical clock). 0 means "none".
pub type Revision = i64;

/// Identifies one request of one machine, so its reply finds its way back.
///
/// Ids are unique within a machine for its whole life; a machine ignores a
/// reply whose id it no longer waits for (late replies after a cancel or a
/// state change are normal, not errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct RpcId(pub u64);

/// A key with its value and metadata, as etcd stores it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Revision at which this key was last created (changes on delete + put).
    pub create_revision: Revision,
    /// Revision of the last modification.
    pub mod_revision: Revision,
    /// Number of modifications since creation.
    pub version: i64,
    /// Lease the key is bound to, 0 for none.
    pub lease: LeaseId,
}

/// The keys a range, delete or watch covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum KeyRange {
    /// Exactly this key.
    Key(Vec<u8>),
    /// Every key starting with these bytes.
    Prefix(Vec<u8>),
    /// Every key starting with `prefix` that is not below `from` (byte
    /// order): the rest of a prefix, for reading it page by page.
    PrefixFrom {
        /// The prefix.
        prefix: Vec<u8>,
        /// The first key that may be included.
        from: Vec<u8>,
    },
    /// Every key starting with `prefix` from `from` (included) up to `to`
    /// (excluded), byte order: one page of a prefix whose range is bounded
    /// as well as its limit, since etcd counts the rest of a page's range
    /// on every page.
    PrefixSpan {
        /// The prefix.
        prefix: Vec<u8>,
        /// The first key that may be included.
        from: Vec<u8>,
        /// The first key past the span.
        to: Vec<u8>,
    },
}

impl KeyRange {
    /// Whether `key` falls in this range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Key(k) => k.as_slice() == key,
            KeyRange::Prefix(p) => key.starts_with(p),
            KeyRange::PrefixFrom { prefix, from } => {
                key.starts_with(prefix) && key >= from.as_slice()
            }
            KeyRange::PrefixSpan { prefix, from, to } => {
                key.starts_with(prefix) && key >= from.as_slice() && key < to.as_slice()
            }
        }
    }
}

/// The first key after every key starting with `prefix` (etcd's
/// `range_end` for a prefix): `prefix` with its last byte below 0xff
/// incremented and what follows dropped; `[0]` ("no end") when every byte
/// is 0xff.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The first key after `key` in byte order: where the next page of a range
/// starts when `key` was the last one read.
pub fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// Order of a range's result. Only create-revision order is needed by the
/// protocols here (election queues and leader lookups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum SortOrder {
    /// Key order (etcd's default).
    #[default]
    Key,
    /// Oldest create revision first.
    CreateAscending,
    /// Newest create revision first.
    CreateDescending,
}

/// A read of a key or prefix, at the current revision or an older one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct RangeRequest {
    /// The keys to read.
    pub range: KeyRange,
    /// Result order.
    pub sort: SortOrder,
    /// At most this many keys; 0 means no limit.
    pub limit: i64,
    /// Only keys with `create_revision <= max_create_revision`; 0 means no bound.
    pub max_create_revision: Revision,
    /// Read the store as it was at this revision; 0 means the current one.
    /// A revision at or below etcd's last compaction that etcd can no longer
    /// serve fails with [`RpcError::Compacted`]. The answer's header
    /// revision is still the *current* store revision, as etcd's is.
    pub revision: Revision,
    /// Answer keys and their revisions and leases with every value empty.
    /// For reads that decide by key and create revision alone (who is
    /// ahead in a queue): etcd then sends no value, and from 3.7 on
    /// serves the read from its index without touching its store.
    pub keys_only: bool,
}

impl RangeRequest {
    /// All keys of `range`, in key order, no limit.
    pub fn all(range: KeyRange) -> Self {
        RangeRequest {
            range,
            sort: SortOrder::Key,
            limit: 0,
            max_create_revision: 0,
            revision: 0,
            keys_only: false,
        }
    }
}

/// One guard of a [`Txn`]; all guards must hold for the success branch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum Compare {
    /// `create_revision(key) == revision` (0 = the key does not exist).
    CreateRevisionEquals {
        /// The key compared.
        key: Vec<u8>,
        /// The expected create revision.
        revision: Revision,
    },
    /// `mod_revision(key) == revision` (0 = the key does not exist).
    ModRevisionEquals {
        /// The key compared.
        key: Vec<u8>,
        /// The expected mod revision.
        revision: Revision,
    },
    /// `value(key) == value`; false when the key does not exist (as etcd
    /// evaluates a value compare on a missing key).
    ValueEquals {
        /// The key compared.
        key: Vec<u8>,
        /// The expected value.
        value: Vec<u8>,
    },
}

/// One operation inside a [`Txn`] branch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum TxnOp {
    /// Write `key = value`, bound to `lease` (0 = no lease).
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The lease, 0 for none.
        lease: LeaseId,
    },
    /// Read.
    Range(RangeRequest),
    /// Delete.
    Delete(KeyRange),
}

/// An etcd transaction: `if all(compare) then success else failure`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct Txn {
    /// Guards; an empty list always succeeds.
    pub compare: Vec<Compare>,
    /// Run when every guard holds.
    pub success: Vec<TxnOp>,
    /// Run otherwise.
    pub failure: Vec<TxnOp>,
}

/// What a machine asks the driver to do against etcd.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum Request {
    /// Grant a lease of `ttl_secs` seconds. etcd may grant a longer TTL.
    Grant {
        /// Requested TTL in whole seconds (>= 1).
        ttl_secs: i64,
    },
    /// Revoke a lease, deleting every key bound to it.
    Revoke {
        /// The lease.
        lease: LeaseId,
    },
    /// Send one renewal for `lease` on its renewal stream and wait for the
    /// reply. The driver opens the stream on first use and reopens it after a
    /// failure; a broken stream fails the outstanding renewal.
    KeepAlive {
        /// The lease.
        lease: LeaseId,
    },
    /// Read a lease's remaining and granted TTL (an operator's question;
    /// no machine needs it, but it goes through the one executor too).
    LeaseTimeToLive {
        /// The lease.
        lease: LeaseId,
    },
    /// Write one key.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
        /// The lease, 0 for none.
        lease: LeaseId,
    },
    /// Read.
    Range(RangeRequest),
    /// Delete.
    Delete(KeyRange),
    /// Transaction.
    Txn(Txn),
    /// Open a watch; it answers with any number of [`Response::WatchEvents`]
    /// (the first, possibly empty, once the watch is created) until it fails,
    /// is canceled by etcd ([`Response::WatchCanceled`]) or by the machine
    /// ([`Command::Cancel`]). Watches carry previous values (`prev_kv`).
    Watch {
        /// The keys watched.
        range: KeyRange,
        /// First revision delivered.
        start_revision: Revision,
    },
}

impl Request {
    /// Whether the request only reads: a [`Request::Range`], a
    /// [`Request::LeaseTimeToLive`], or a [`Request::Txn`] whose every
    /// operation is a range. Only such a request may be sent a second time
    /// while the first is unanswered: whichever answer comes, nothing was
    /// written twice. A write sent again could apply twice (the first may
    /// still reach etcd), and a renewal or a watch has its own stream.
    #[must_use]
    pub fn is_read_only(&self) -> bool {
        match self {
            Request::Range(_) | Request::LeaseTimeToLive { .. } => true,
            Request::Txn(txn) => txn
                .success
                .iter()
                .chain(&txn.failure)
                .all(|op| matches!(op, TxnOp::Range(_))),
            Request::Grant { .. }
            | Request::Revoke { .. }
            | Request::KeepAlive { .. }
            | Request::Put { .. }
            | Request::Delete(_)
            | Request::Watch { .. } => false,
        }
    }
}

/// Whether a watch event wrote or deleted its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum EventKind {
    /// A put (create or update).
    Put,
    /// A delete, including one caused by a lease expiring or being revoked.
    Delete,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change. For a delete only `key` and `mod_revision`
    /// (the delete's revision) are meaningful.
    pub kv: KeyValue,
    /// The key before the change, when etcd still had it.
    pub prev_kv: Option<KeyValue>,
}

/// The result of one operation inside a [`Txn`] branch, in branch order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum TxnOpResponse {
    /// A put was applied.
    Put,
    /// Keys read.
    Range {
        /// The keys, in the requested order.
        kvs: Vec<KeyValue>,
    },
    /// Keys deleted.
    Delete {
        /// How many keys were deleted.
        deleted: i64,
    },
}

/// etcd's answer to a [`Request`]. Every variant carries the store revision
/// from the response header where etcd provides one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub enum Response {
    /// Answer to [`Request::Grant`].
    Granted {
        /// The new lease.
        lease: LeaseId,
        /// The TTL etcd actually granted, in seconds.
        ttl_secs: i64,
    },
    /// Answer to [`Request::Revoke`].
    Revoked,
    /// Answer to [`Request::KeepAlive`]. `ttl_secs == 0` means the lease no
    /// longer exists.
    KeptAlive {
        /// Remaining TTL after the renewal.
        ttl_secs: i64,
    },
    /// Answer to [`Request::LeaseTimeToLive`]. `ttl_secs < 0` means the
    /// lease does not exist (etcd answers -1).
    LeaseTimeToLive {
        /// Seconds left before etcd expires the lease unless renewed.
        ttl_secs: i64,
        /// The TTL etcd granted.
        granted_secs: i64,
    },
    /// Answer to [`Request::Put`].
    Put {
        /// Revision of the write.
        revision: Revision,
    },
    /// Answer to [`Request::Range`].
    Range {
        /// Store revision the read was served at.
        revision: Revision,
        /// The keys.
        kvs: Vec<KeyValue>,
    },
    /// Answer to [`Request::Delete`].
    Deleted {
        /// Store revision after the delete.
        revision: Revision,
        /// How many keys were deleted.
        deleted: i64,
    },
    /// Answer to [`Request::Txn`].
    Txn {
        /// Store revision after the transaction.
        revision: Revision,
        /// Whether the guards held.
        succeeded: bool,
        /// Results of the branch that ran.
        responses: Vec<TxnOpResponse>,
    },
    /// Changes on a watch, in revision order. Empty when the watch was just
    /// created.
    WatchEvents {
        /// The changes.
        events: Vec<WatchEvent>,
    },
    /// etcd ended the watch. `compact_revision > 0` means the start revision
    /// was compacted away.
    WatchCanceled {
        /// The compaction revision, or 0.
        compact_revision: Revision,
    },
}

/// Why a request failed.
///
/// Machines branch on the variant, never on the message: the driver decides
/// the variant once, from etcd's gRPC status code (see fleetcoord's
/// `driver/exec.rs`), and the strings are kept for logs only.
///
/// What a machine may do next:
///
/// | variant | resend the same request? | did etcd apply it? |
/// |---|---|---|
/// | [`Unavailable`](RpcError::Unavailable) | yes, later | unknown |
/// | [`Unauthenticated`](RpcError::Unauthenticated) | yes (the client re-authenticates) | no |
/// | [`Rejected`](RpcError::Rejected) | no | no |
/// | [`LeaseNotFound`](RpcError::LeaseNotFound) | no: the lease is gone | no |
/// | [`Compacted`](RpcError::Compacted) | no: read again at the current revision | no |
/// | [`PermissionDenied`](RpcError::PermissionDenied) | no | no |
/// | [`NoSpace`](RpcError::NoSpace) | not before an operator frees space | no |
///
/// [`RpcError::is_retryable`] is the first column; [`RpcError::is_refusal`]
/// the last.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
#[non_exhaustive]
pub enum RpcError {
    /// etcd could not be reached, the connection or stream broke, the call
    /// timed out, or etcd was busy (no leader, leader changed). The request
    /// may or may not have been applied; sending it again later may succeed.
    Unavailable(String),
    /// etcd refused the request (bad argument, too large, too many
    /// operations, ...); retrying the same request will not help.
    Rejected(String),
    /// The lease the request names does not exist any more: it expired or
    /// was revoked (etcd's `ErrGRPCLeaseNotFound`). Only a new lease helps.
    LeaseNotFound,
    /// The revision the request asked for has been compacted away (etcd's
    /// `ErrGRPCCompacted`): start over from a fresh read. A watch learns of
    /// compaction differently, from [`Response::WatchCanceled`], because
    /// etcd ends such a watch with a response rather than an error.
    Compacted {
        /// The compaction revision when etcd said it, else 0.
        compact_revision: Revision,
    },
    /// The authenticated user may not do this (etcd's
    /// `ErrGRPCPermissionDenied`); retrying will not help until an operator
    /// grants the permission.
    PermissionDenied(String),
    /// etcd refused the auth token, which expired or was invalidated (etcd's
    /// `ErrGRPCInvalidAuthToken`). Retryable: the client re-authenticates
    /// before its next call, and a failed re-authentication is reported as
    /// [`RpcError::Rejected`], so retries end.
    Unauthenticated(String),
    /// etcd's database is full: its `NOSPACE` alarm is raised (the backend
    /// reached `--quota-backend-bytes`; etcd's `ErrGRPCNoSpace`). Every
    /// request that would grow it (a put, a transaction that puts, a lease
    /// grant) is refused, on every member, until an operator compacts,
    /// defragments and disarms the alarm; reads, deletes, revokes and lease
    /// renewals are still served. Not applied. Not retryable here: a resend
    /// fails the same way until the alarm is disarmed, so a machine that
    /// must outlast it (a lease being re-granted) waits on its own backoff.
    NoSpace(String),
}

impl RpcError {
    /// Whether sending the same request again later may succeed. True for
    /// [`RpcError::Unavailable`] and [`RpcError::Unauthenticated`]; see the
    /// table on [`RpcError`].
    pub fn is_retryable(&self) -> bool {
        match self {
            RpcError::Unavailable(_) | RpcError::Unauthenticated(_) => true,
            RpcError::Rejected(_)
            | RpcError::LeaseNotFound
            | RpcError::Compacted { .. }
            | RpcError::PermissionDenied(_)
            | RpcError::NoSpace(_) => false,
        }
    }

    /// Whether etcd answered and refused the request, so it was certainly
    /// not applied. Only [`RpcError::Unavailable`] leaves that open.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, RpcError::Unavailable(_))
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Unavailable(message)
            | RpcError::Rejected(message)
            | RpcError::PermissionDenied(message)
            | RpcError::Unauthenticated(message) => f.write_str(message),
            RpcError::NoSpace(message) => write!(
                f,
                "etcd is out of space (its NOSPACE alarm is raised; writes are refused until \
                 an operator compacts, defragments and runs `etcdctl alarm disarm`): {message}"
            ),
            RpcError::LeaseNotFound => f.write_str("lease not found"),
            RpcError::Compacted {
                compact_revision: 0,
            } => f.write_str("the requested revision has been compacted"),
            RpcError::Compacted { compact_revision } => write!(
                f,
                "the requested revision has been compacted (compaction revision {compact_revision})"
            ),
        }
    }
}

impl std::error::Error for RpcError {}

/// A reply to a [`Command::Rpc`], handed back to the machine that asked.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct RpcReply {
    /// The request this answers.
    pub id: RpcId,
    /// The outcome.
    pub result: Result<Response, RpcError>,
}

/// What a machine asks of its driver. `N` is the machine's notification type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command<N> {
    /// Run `request` against etcd and hand the outcome back as an [`RpcReply`]
    /// with this `id`.
    Rpc {
        /// Correlates the reply.
        id: RpcId,
        /// What to run.
        request: Request,
    },
    /// Stop a watch or forget an outstanding request; no reply is expected
    /// (one that arrives anyway is ignored).
    Cancel {
        /// The request to stop.
        id: RpcId,
    },
    /// Tell the user something.
    Notify(N),
}

/// Allocates [`RpcId`]s in increasing order.
#[derive(Clone, Debug, Default)]
pub struct RpcIds {
    next: u64,
}

impl RpcIds {
    /// Ids starting at `first`; machines composed into one use disjoint ranges.
    pub fn starting_at(first: u64) -> Self {
        RpcIds { next: first }
    }

    /// The next unused id.
    pub fn next_id(&mut self) -> RpcId {
        let id = RpcId(self.next);
        self.next += 1;
        id
    }

    /// The id [`RpcIds::next_id`] will return next, without using it:
    /// every id issued so far is below it.
    pub fn peek(&self) -> RpcId {
        RpcId(self.next)
    }
}
