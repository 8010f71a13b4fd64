//! The etcd requests of the election protocol, in one place so the key
//! layout and guards stay Go-compatible (`clientv3/concurrency`).

use super::RwRole;
use crate::rpc::{
    Compare, KeyRange, LeaseId, RangeRequest, Request, Revision, SortOrder, Txn, TxnOp,
};

/// `prefix + lowercase hex lease id`: the key Go's `concurrency.Election`
/// and `etcdctl elect` use, so processes in both languages share a queue.
pub(crate) fn candidate_key(prefix: &[u8], lease: LeaseId) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// The own key of a read-write lock's reader or writer under the lock's
/// `root` (`<name>/`, ending with `/`): `<root>read/<lease hex>` or
/// `<root>write/<lease hex>`. Go's `recipes.RWMutex` puts its keys at
/// `<name>/read/<unique>` and `<name>/write/<unique>` and orders them by
/// revision only, so any unique last segment shares its queue; the lease
/// id is unique per session, as [`candidate_key`]'s is.
pub(crate) fn own_key(root: &[u8], rw: Option<RwRole>, lease: LeaseId) -> Vec<u8> {
    let mut dir = root.to_vec();
    match rw {
        None => {}
        Some(RwRole::Read) => dir.extend_from_slice(RW_READ),
        Some(RwRole::Write) => dir.extend_from_slice(RW_WRITE),
    }
    candidate_key(&dir, lease)
}

/// The directory of a read-write lock's readers, below its root.
pub(crate) const RW_READ: &[u8] = b"read/";
/// The directory of a read-write lock's writers, below its root.
pub(crate) const RW_WRITE: &[u8] = b"write/";

/// The keys that may keep the own key of `rw` under `root` from holding:
/// for a reader only the writers (`<root>write/`, what Go's `RLock`
/// waits on), for a writer and an election candidate every key under the
/// root (what Go's `Lock` and `Campaign` wait on).
pub(crate) fn queue_prefix(root: &[u8], rw: Option<RwRole>) -> Vec<u8> {
    let mut queue = root.to_vec();
    if rw == Some(RwRole::Read) {
        queue.extend_from_slice(RW_WRITE);
    }
    queue
}

fn create_rev_is(key: &[u8], revision: Revision) -> Compare {
    Compare::CreateRevisionEquals {
        key: key.to_vec(),
        revision,
    }
}

fn put(key: &[u8], value: &[u8], lease: LeaseId) -> TxnOp {
    TxnOp::Put {
        key: key.to_vec(),
        value: value.to_vec(),
        lease,
    }
}

/// The first-created key with its value: what a `TryCampaign` that does
/// not lead reports as the leader, read in the txn that decided it. The
/// limit bounds what etcd sends to one value however long the queue.
fn first_created(prefix: &[u8]) -> TxnOp {
    TxnOp::Range(first_created_range(prefix))
}

fn first_created_range(prefix: &[u8]) -> RangeRequest {
    RangeRequest {
        range: KeyRange::Prefix(prefix.to_vec()),
        sort: SortOrder::CreateAscending,
        limit: 1,
        max_create_revision: 0,
        revision: 0,
        keys_only: false,
    }
}

/// Find the leader of the election under `prefix`: the candidate key with
/// the lowest create revision (the rule every candidate and Go's client
/// follow). The answer's single key, if any, is the leader, with an empty
/// value: a sort by create revision makes etcd 3.4-3.6 read every
/// candidate, so the read asks for keys only (nothing but the leader's key
/// is sent, and etcd 3.7 serves it from its index). Read the value with
/// [`leader_value_query`].
pub fn leader_query(prefix: &[u8]) -> Request {
    Request::Range(RangeRequest {
        keys_only: true,
        ..first_created_range(prefix)
    })
}

/// The leader's value, once [`leader_query`] named its `key`: a point read,
/// which costs etcd one key whatever the queue's length. The answer is the
/// leader's only while the key's create revision is still the one
/// [`leader_query`] returned; another one means the leadership changed in
/// between.
pub fn leader_value_query(key: &[u8]) -> Request {
    Request::Range(RangeRequest::all(KeyRange::Key(key.to_vec())))
}

/// Join the queue: create my key unless it exists, else read it back; in
/// the same revision read who is ahead of me, so the answer alone says
/// whether I lead and needs no separate verification. The ops of a txn see
/// one revision and a range sees the txn's own earlier puts, so:
/// * created: my key is the newest created at that revision, and the
///   next key of the newest [`NEWEST_LIMIT`] (if any) is the one I wait
///   for; none means nothing is older than my key, which exists: I lead.
///   The third tells whether that one is the only key ahead of me.
/// * already there (a retry after a lost answer): my key as it is, and the
///   first-created key: if that is mine I lead.
pub(crate) fn create(prefix: &[u8], key: &[u8], value: &[u8], lease: LeaseId) -> Request {
    Request::Txn(Txn {
        compare: vec![create_rev_is(key, 0)],
        success: vec![put(key, value, lease), TxnOp::Range(newest(prefix))],
        failure: already_there(prefix, key, false),
    })
}

/// Like [`create`], but reading who is first in line on success too: a
/// `TryCampaign` that does not lead names the leader, so it needs the first
/// key, not the one just ahead of it.
pub(crate) fn try_create(prefix: &[u8], key: &[u8], value: &[u8], lease: LeaseId) -> Request {
    Request::Txn(Txn {
        compare: vec![create_rev_is(key, 0)],
        success: vec![put(key, value, lease), first_created(prefix)],
        failure: already_there(prefix, key, true),
    })
}

/// The failure branch of [`create`] and [`try_create`]: my key as it is,
/// then the first-created key of the election, with its value only when
/// it may be reported as the leader (`with_value`, a `TryCampaign`).
fn already_there(prefix: &[u8], key: &[u8], with_value: bool) -> Vec<TxnOp> {
    vec![
        TxnOp::Range(RangeRequest::all(KeyRange::Key(key.to_vec()))),
        TxnOp::Range(RangeRequest {
            keys_only: !with_value,
            ..first_created_range(prefix)
        }),
    ]
}

/// How many of the newest candidates [`create`] reads: mine, the one just
/// ahead of me, and one more to tell whether that one is the only one.
pub(crate) const NEWEST_LIMIT: i64 = 3;

/// How many keys older than mine [`older_and_mine`] reads: the one just
/// ahead of me, and one more to tell whether that one is the only one.
pub(crate) const OLDER_LIMIT: i64 = 2;

/// The newest candidates: right after my create, mine first.
/// Keys only: the decision needs keys and create revisions, and etcd
/// 3.4-3.6 reads the whole prefix for this sort; values would only add
/// what it sends (and, from 3.7, what it reads from its store).
fn newest(prefix: &[u8]) -> RangeRequest {
    RangeRequest {
        range: KeyRange::Prefix(prefix.to_vec()),
        sort: SortOrder::CreateDescending,
        limit: NEWEST_LIMIT,
        max_create_revision: 0,
        revision: 0,
        keys_only: true,
    }
}

/// Overwrite my value only while my key is still the one created at `token`
/// (used by proclaim and when a campaign finds a stale value).
pub(crate) fn guarded_put(key: &[u8], value: &[u8], lease: LeaseId, token: Revision) -> Request {
    fenced_txn(key, token, vec![put(key, value, lease)])
}

/// Delete my key only if it is still the one created at `token`; a key of a
/// later campaign must survive a late withdrawal of an earlier one.
pub(crate) fn guarded_delete(key: &[u8], token: Revision) -> Request {
    fenced_txn(key, token, vec![TxnOp::Delete(KeyRange::Key(key.to_vec()))])
}

/// The fence: a transaction that runs `ops` only while the candidate `key`
/// still exists with create revision `token`, i.e. only while that
/// leadership is current in etcd. Resign, proclaim and users' guarded
/// writes all go through it.
pub fn fenced_txn(key: &[u8], token: Revision, ops: Vec<TxnOp>) -> Request {
    Request::Txn(Txn {
        compare: vec![create_rev_is(key, token)],
        success: ops,
        failure: vec![],
    })
}

/// The newest keys created before mine (the newest is the one candidate I
/// wait for, as Go's `waitDeletes` does, so a release wakes one waiter, not
/// the herd; a second tells whether it is the only one) and, in the same
/// revision, my own key: one answer tells both whether
/// anyone is still ahead and whether my key is still the one created at
/// `token`, so no separate verification read follows (Go skips that check,
/// etcd #19597). No guards: the txn only makes the two reads atomic.
pub(crate) fn older_and_mine(prefix: &[u8], key: &[u8], token: Revision) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![
            TxnOp::Range(newest_older(prefix, token)),
            TxnOp::Range(RangeRequest::all(KeyRange::Key(key.to_vec()))),
        ],
        failure: vec![],
    })
}

fn newest_older(prefix: &[u8], token: Revision) -> RangeRequest {
    RangeRequest {
        range: KeyRange::Prefix(prefix.to_vec()),
        sort: SortOrder::CreateDescending,
        limit: OLDER_LIMIT,
        // max_create_revision 0 means "no bound"; a revision of 1 can
        // never have an older key, so clamp to 1 and let the answer show it.
        max_create_revision: token.saturating_sub(1).max(1),
        revision: 0,
        // Key and create revision decide; see [`newest`].
        keys_only: true,
    }
}

/// Read exactly one key.
pub(crate) fn read_key(key: &[u8]) -> Request {
    Request::Range(RangeRequest::all(KeyRange::Key(key.to_vec())))
}

/// Watch every candidate key from `start_revision`: what the candidate
/// second in line waits with, so that the one delete it waits for and
/// every change of its own key arrive on one ordered stream.
pub(crate) fn watch_prefix(prefix: &[u8], start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(prefix.to_vec()),
        start_revision,
    }
}

/// Watch exactly one key from `start_revision`.
pub(crate) fn watch_key(key: &[u8], start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Key(key.to_vec()),
        start_revision,
    }
}

// ----- N permits ----------------------------------------------------------
//
// A semaphore is the election with `permits` holders: the candidate with
// fewer than `permits` keys older than its own holds. With one permit the
// functions below are never used (the election keeps its own requests
// above), so a Go-compatible election sends exactly what it always did.

/// `permits` as a range limit; the protocol never asks for 0 permits.
fn limit_of(permits: u32) -> i64 {
    i64::from(permits.max(1))
}

/// The oldest `permits` keys: the holders, if they all still hold. Keys
/// only: a semaphore reports no holder's value, and the decision needs
/// keys and create revisions alone.
fn first_created_n(prefix: &[u8], permits: u32) -> RangeRequest {
    RangeRequest {
        limit: limit_of(permits),
        keys_only: true,
        ..first_created_range(prefix)
    }
}

/// The failure branch of [`create_n`] and [`try_create_n`]: my key as it
/// is, then the oldest `permits` keys (am I among them?).
fn already_there_n(prefix: &[u8], key: &[u8], permits: u32) -> Vec<TxnOp> {
    vec![
        TxnOp::Range(RangeRequest::all(KeyRange::Key(key.to_vec()))),
        TxnOp::Range(first_created_n(prefix, permits)),
    ]
}

/// How many keys [`create_n`] reads on success: mine, the `permits` just
/// ahead of me, and one more to tell whether those are all.
pub(crate) fn newest_limit_n(permits: u32) -> i64 {
    limit_of(permits).saturating_add(2)
}

/// How many keys older than mine [`older_and_mine_n`] reads: the
/// `permits` just ahead of me, and one more to tell whether those are all.
pub(crate) fn older_limit_n(permits: u32) -> i64 {
    limit_of(permits).saturating_add(1)
}

/// [`create`] for `permits` holders: on success the newest
/// [`newest_limit_n`] keys, mine first, then up to `permits + 1` older
/// ones: fewer than `permits` older means I hold; otherwise the newest
/// `permits` are the ones to watch, and whether a further one came says
/// whether they are all that is ahead.
pub(crate) fn create_n(
    prefix: &[u8],
    key: &[u8],
    value: &[u8],
    lease: LeaseId,
    permits: u32,
) -> Request {
    Request::Txn(Txn {
        compare: vec![create_rev_is(key, 0)],
        success: vec![
            put(key, value, lease),
            TxnOp::Range(RangeRequest {
                range: KeyRange::Prefix(prefix.to_vec()),
                sort: SortOrder::CreateDescending,
                limit: newest_limit_n(permits),
                max_create_revision: 0,
                revision: 0,
                keys_only: true,
            }),
        ],
        failure: already_there_n(prefix, key, permits),
    })
}

/// [`try_create`] for `permits` holders: reads the oldest `permits` keys
/// on both branches; I hold iff mine is among them, else the first of
/// them is the holder reported.
pub(crate) fn try_create_n(
    prefix: &[u8],
    key: &[u8],
    value: &[u8],
    lease: LeaseId,
    permits: u32,
) -> Request {
    Request::Txn(Txn {
        compare: vec![create_rev_is(key, 0)],
        success: vec![
            put(key, value, lease),
            TxnOp::Range(first_created_n(prefix, permits)),
        ],
        failure: already_there_n(prefix, key, permits),
    })
}

/// [`older_and_mine`] for `permits` holders: the newest
/// [`older_limit_n`] keys created before mine, and my key, at one
/// revision. Fewer than `permits` returned means I hold; the count comes
/// from the keys returned under the limit, never from etcd's `count`,
/// which ignores the revision filters.
pub(crate) fn older_and_mine_n(
    prefix: &[u8],
    key: &[u8],
    token: Revision,
    permits: u32,
) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: vec![
            TxnOp::Range(RangeRequest {
                limit: older_limit_n(permits),
                ..newest_older(prefix, token)
            }),
            TxnOp::Range(RangeRequest::all(KeyRange::Key(key.to_vec()))),
        ],
        failure: vec![],
    })
}

// ----- priorities and hand-over ---------------------------------------
//
// Used only by campaigns that opted in (`ElectionInput::CampaignRanked`)
// and by `ElectionInput::HandOver`; plain campaigns never send these.

/// The byte that separates an election's name from its side keys. Names
/// and prefixes may not contain control characters, so no election's
/// candidate prefix (`<prefix><name>/`) can equal or contain a side
/// namespace; and `/` is not used, so side keys lie outside the candidate
/// prefix that Go, `etcdctl elect` and [`leader_query`] read.
const SIDE_SEPARATOR: u8 = 0x1f;

/// `prefix` (a candidate prefix, ending with `/`) without that `/`, then
/// [`SIDE_SEPARATOR`] and `what`.
fn side(prefix: &[u8], what: &[u8]) -> Vec<u8> {
    let mut base = prefix.strip_suffix(b"/").unwrap_or(prefix).to_vec();
    base.push(SIDE_SEPARATOR);
    base.extend_from_slice(what);
    base
}

/// Where candidates of the election with candidate prefix `prefix` publish
/// their priorities: `<prefix without its final '/'>\x1fpriority/`, one key
/// per ranked candidate, named by its lease in lowercase hex like its
/// candidate key, bound to the same lease.
pub fn priority_prefix(prefix: &[u8]) -> Vec<u8> {
    side(prefix, b"priority/")
}

/// Where an operator asks the leader of the election with candidate prefix
/// `prefix` to hand over (`fleetcoord elect hand-over`): one key, whose
/// value names the candidate that should lead next.
pub fn hand_over_request_key(prefix: &[u8]) -> Vec<u8> {
    side(prefix, b"hand-over")
}

/// Where the leader of the election with candidate prefix `prefix` says
/// why it refused the request at [`hand_over_request_key`]: one key, whose
/// value is the reason, so that the operator who asked learns it at once.
pub fn hand_over_refusal_key(prefix: &[u8]) -> Vec<u8> {
    side(prefix, b"hand-over-refused")
}

/// The priority key of the candidate on `lease`.
pub(crate) fn priority_key(prefix: &[u8], lease: LeaseId) -> Vec<u8> {
    let mut key = priority_prefix(prefix);
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// The priority a priority key's value states; `None` for a value no
/// fleetcoord candidate writes.
pub(crate) fn parse_priority(value: &[u8]) -> Option<u32> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Every candidate, oldest first: the whole queue, for the decisions that
/// need more than the key just ahead (bumps, hand-over). `keys_only`
/// wherever no value is compared: ranks come from the priority keys, and
/// candidates' values would make etcd send the whole queue's values on
/// every ranked decision.
fn queue(prefix: &[u8], keys_only: bool) -> RangeRequest {
    RangeRequest {
        range: KeyRange::Prefix(prefix.to_vec()),
        sort: SortOrder::CreateAscending,
        limit: 0,
        max_create_revision: 0,
        revision: 0,
        keys_only,
    }
}

/// Every published priority.
fn priorities(prefix: &[u8]) -> RangeRequest {
    RangeRequest::all(KeyRange::Prefix(priority_prefix(prefix)))
}

/// The two reads every ranked decision is made of, at one revision: the
/// queue (keys only unless a value is compared), then the published
/// priorities.
fn queue_and_priorities(prefix: &[u8], keys_only: bool) -> Vec<TxnOp> {
    vec![
        TxnOp::Range(queue(prefix, keys_only)),
        TxnOp::Range(priorities(prefix)),
    ]
}

/// A ranked join: [`create`] that also publishes my priority (on my lease,
/// in the same txn, so a candidate is never queued under a priority it
/// did not state) and reads the whole queue and every priority at that
/// revision. The failure branch (my key exists: a retry after a lost
/// answer) writes the priority again and reads the same, with values:
/// whether my key holds my value is compared there.
pub(crate) fn create_ranked(
    prefix: &[u8],
    key: &[u8],
    value: &[u8],
    lease: LeaseId,
    priority: u32,
) -> Request {
    let publish = put(
        &priority_key(prefix, lease),
        priority.to_string().as_bytes(),
        lease,
    );
    let mut success = vec![put(key, value, lease), publish.clone()];
    success.extend(queue_and_priorities(prefix, true));
    let mut failure = vec![publish];
    failure.extend(queue_and_priorities(prefix, false));
    Request::Txn(Txn {
        compare: vec![create_rev_is(key, 0)],
        success,
        failure,
    })
}

/// A ranked candidate's read of the queue and the priorities (where a
/// plain one sends [`older_and_mine`]); my key is in the queue if it
/// exists.
pub(crate) fn ranked_read(prefix: &[u8]) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: queue_and_priorities(prefix, true),
        failure: vec![],
    })
}

/// A leader's read before a hand-over: [`ranked_read`] with every
/// candidate's value, since the target may be named by its value. An
/// operator's request, not a step of every campaign.
pub(crate) fn hand_over_read(prefix: &[u8]) -> Request {
    Request::Txn(Txn {
        compare: vec![],
        success: queue_and_priorities(prefix, false),
        failure: vec![],
    })
}

/// Bump `victims` (waiting keys with their create revisions) to the back
/// of the queue by deleting them, only while the leader `oldest` still
/// holds its key with its create revision and each victim is still the
/// key it was: every victim is then younger than a live leader, so none
/// of them leads or believes it does, and deleting it can only cost it its
/// place (it joins again at the back). Either branch reads the queue and
/// the priorities again.
pub(crate) fn bump(
    prefix: &[u8],
    oldest: (&[u8], Revision),
    victims: &[(Vec<u8>, Revision)],
) -> Request {
    let mut compare = vec![create_rev_is(oldest.0, oldest.1)];
    compare.extend(victims.iter().map(|(k, r)| create_rev_is(k, *r)));
    let mut success: Vec<TxnOp> = victims
        .iter()
        .map(|(k, _)| TxnOp::Delete(KeyRange::Key(k.clone())))
        .collect();
    success.extend(queue_and_priorities(prefix, true));
    Request::Txn(Txn {
        compare,
        success,
        failure: queue_and_priorities(prefix, true),
    })
}

/// Withdraw a ranked candidate: [`guarded_delete`], and the priority key
/// in either branch (a key bumped before the withdraw leaves its priority
/// behind otherwise, for as long as the session lives). Token 0 guards on
/// "my key does not exist" and so deletes only the priority key.
pub(crate) fn withdraw_ranked(key: &[u8], token: Revision, priority_key: &[u8]) -> Request {
    let drop_priority = TxnOp::Delete(KeyRange::Key(priority_key.to_vec()));
    let delete = TxnOp::Delete(KeyRange::Key(key.to_vec()));
    Request::Txn(Txn {
        compare: vec![create_rev_is(key, token)],
        success: vec![delete, drop_priority.clone()],
        failure: vec![drop_priority],
    })
}

/// The most keys a hand-over deletes besides the leader's own (etcd takes
/// at most 128 operations per txn; the leader's key, its priority key and
/// the target's guard need room too).
pub(crate) const HAND_OVER_MAX_AHEAD: usize = 120;

/// The leader's hand-over: delete my key (and my priority key, if ranked)
/// and every key `ahead` of the `target`, only while my key is still the
/// one created at `token`, the target still the key it was, and each key
/// ahead unchanged. Then the target is the oldest key left. The failure
/// branch reads the target's key and mine, to tell "target gone" from "I
/// no longer lead" from "the queue moved".
pub(crate) fn hand_over(
    key: &[u8],
    token: Revision,
    my_priority_key: Option<&[u8]>,
    target: (&[u8], Revision),
    ahead: &[(Vec<u8>, Revision)],
) -> Request {
    let mut compare = vec![create_rev_is(key, token), create_rev_is(target.0, target.1)];
    compare.extend(ahead.iter().map(|(k, r)| create_rev_is(k, *r)));
    let mut success = vec![TxnOp::Delete(KeyRange::Key(key.to_vec()))];
    if let Some(p) = my_priority_key {
        success.push(TxnOp::Delete(KeyRange::Key(p.to_vec())));
    }
    success.extend(
        ahead
            .iter()
            .map(|(k, _)| TxnOp::Delete(KeyRange::Key(k.clone()))),
    );
    Request::Txn(Txn {
        compare,
        success,
        failure: vec![
            TxnOp::Range(RangeRequest::all(KeyRange::Key(target.0.to_vec()))),
            TxnOp::Range(RangeRequest::all(KeyRange::Key(key.to_vec()))),
        ],
    })
}

/// Read every published priority (a ranked leader, once at election and
/// after its watch broke).
pub(crate) fn read_priorities(prefix: &[u8]) -> Request {
    Request::Range(priorities(prefix))
}

/// Watch every published priority from `start_revision` (a ranked leader:
/// one watch per election, none per waiter).
pub(crate) fn watch_priorities(prefix: &[u8], start_revision: Revision) -> Request {
    Request::Watch {
        range: KeyRange::Prefix(priority_prefix(prefix)),
        start_revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every range of `request`, wherever it sits in a txn.
    fn ranges(request: &Request) -> Vec<RangeRequest> {
        match request {
            Request::Range(r) => vec![r.clone()],
            Request::Txn(t) => t
                .success
                .iter()
                .chain(&t.failure)
                .filter_map(|op| match op {
                    TxnOp::Range(r) => Some(r.clone()),
                    _ => None,
                })
                .collect(),
            _ => vec![],
        }
    }

    /// Whether etcd 3.4-3.6 reads every key and value of `r`'s range from
    /// its store to answer it (a sort other than by key, or a revision
    /// filter, makes it drop the limit).
    fn reads_whole_range(r: &RangeRequest) -> bool {
        r.sort != SortOrder::Key || r.max_create_revision != 0
    }

    /// The read shape of every request a campaign, a wait, a hand-over
    /// between waiters or a leader lookup sends: a range that makes etcd
    /// read the whole queue sends back keys only, except the two whose
    /// single value is reported as the leader (a `TryCampaign` that does
    /// not lead), which their limit of 1 bounds; and a point read or a
    /// key-ordered read is what reads a value.
    #[test]
    fn queue_reads_ask_for_keys_only_and_values_come_bounded() {
        let (p, k) = (b"/e/".as_slice(), b"/e/2a".as_slice());
        let campaign = [
            create(p, k, b"v", 0x2a),
            older_and_mine(p, k, 9),
            create_n(p, k, b"v", 0x2a, 3),
            try_create_n(p, k, b"v", 0x2a, 3),
            older_and_mine_n(p, k, 9, 3),
            leader_query(p),
            ranked_read(p),
            bump(p, (k, 3), &[(b"/e/3b".to_vec(), 4)]),
        ];
        for request in &campaign {
            for r in ranges(request) {
                if reads_whole_range(&r) {
                    assert!(r.keys_only, "{r:?} in {request:?}");
                }
            }
        }
        // Reported as the leader: one value, at most.
        for r in ranges(&try_create(p, k, b"v", 0x2a)) {
            if reads_whole_range(&r) && !r.keys_only {
                assert_eq!(r.limit, 1, "{r:?}");
            }
        }
        // Whether my value is still mine, and the leader's value: point reads.
        assert_eq!(
            leader_value_query(k),
            Request::Range(RangeRequest::all(KeyRange::Key(k.to_vec())))
        );
        // The queue reads that do carry values: an operator's hand-over
        // (the target may be named by value), and a retried ranked create
        // (my value is compared), never a plain campaign's step.
        assert!(ranges(&hand_over_read(p)).iter().any(|r| !r.keys_only));
        let ranked = create_ranked(p, k, b"v", 0x2a, 5);
        let Request::Txn(t) = &ranked else {
            panic!("{ranked:?}")
        };
        assert!(t.success.iter().all(|op| match op {
            TxnOp::Range(r) => !reads_whole_range(r) || r.keys_only,
            _ => true,
        }));
    }

    #[test]
    fn side_keys_lie_outside_every_candidate_prefix() {
        assert_eq!(
            super::priority_key(b"/x/db/", 0x2a),
            b"/x/db\x1fpriority/2a".to_vec()
        );
        assert_eq!(
            super::hand_over_request_key(b"db/"),
            b"db\x1fhand-over".to_vec()
        );
        assert_eq!(
            super::hand_over_refusal_key(b"db/"),
            b"db\x1fhand-over-refused".to_vec()
        );
        assert!(!super::priority_prefix(b"/x/db/").starts_with(b"/x/db/"));
        assert_eq!(super::parse_priority(b"7"), Some(7));
        assert_eq!(super::parse_priority(b"-1"), None);
    }

    #[test]
    fn candidate_keys_are_the_prefix_plus_lowercase_hex_lease() {
        assert_eq!(
            super::candidate_key(b"/x/", 0x694d_77a5_c8e1_f00d),
            b"/x/694d77a5c8e1f00d".to_vec()
        );
    }
}
