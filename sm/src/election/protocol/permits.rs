//! The campaign steps that differ when more than one candidate may hold
//! (a semaphore of `permits` permits): join the queue, read, and wait so
//! that a waiter holds once fewer than `permits` keys are older than its
//! own. Everything else (the session, the holder's guard, the fence,
//! withdraw and resign, deadlines) is the election's, unchanged.
//!
//! Safety, for `permits` = N: a candidate holds only after one read, at one
//! revision, showed its key with its token and fewer than N older keys. No
//! key created later is older, so among the keys alive at any instant the
//! believed holders are the oldest; for the newest of them, every other
//! holder's key was alive and older at its read: fewer than N others.

use super::{requests, Campaign, Op, Protocol, Step};
use crate::rpc::{EventKind, KeyValue, Response, Revision, RpcError, RpcId};

impl Protocol {
    /// The request(s) of `c`'s step when it differs from the election's,
    /// queued; `None` for a step the election sends as it always does.
    pub(super) fn send_step_n(&mut self, c: &mut Campaign) -> Option<Op> {
        let permits = self.permits;
        let request = match &c.step {
            Step::Create if c.try_only => {
                requests::try_create_n(&self.prefix, &c.key, &c.value, c.lease, permits)
            }
            Step::Create => requests::create_n(&self.prefix, &c.key, &c.value, c.lease, permits),
            Step::FindOlder => requests::older_and_mine_n(&self.prefix, &c.key, c.token, permits),
            Step::WatchOlders { keys, from, .. } => {
                // A watch is answered when something happens, not in time.
                let (keys, from) = (keys.clone(), *from);
                self.end_attempt(super::Timer::Attempt);
                let ids: Vec<RpcId> = keys
                    .iter()
                    .map(|key| self.outbox.rpc(requests::watch_key(key, from)))
                    .collect();
                c.pending = ids.first().copied();
                self.extra_watches = ids.get(1..).unwrap_or_default().to_vec();
                if let Step::WatchOlders { ids: step_ids, .. } = &mut c.step {
                    *step_ids = ids;
                }
                return Some(Op::Campaigning(c.clone()));
            }
            // A ranked campaign never runs with more than one permit
            // (`user_idle` refuses it), so `Bump` is the election's too.
            Step::FixValue | Step::WatchOlder { .. } | Step::Bump { .. } => return None,
        };
        c.pending = Some(self.send_unary(request));
        Some(Op::Campaigning(c.clone()))
    }

    /// `read` is the answer of a range, at `revision`, that holds every key
    /// older than mine up to `permits` of them (and maybe mine), my key
    /// existing with my token at that revision: hold with fewer than
    /// `permits` older, else watch each of the `permits` older ones.
    pub(super) fn wait_or_hold(
        &mut self,
        mut c: Campaign,
        revision: Revision,
        read: &[KeyValue],
    ) -> Op {
        let limit = usize::try_from(self.permits).unwrap_or(usize::MAX);
        let older: Vec<Vec<u8>> = read
            .iter()
            .filter(|kv| kv.create_revision < c.token && kv.key != c.key)
            .take(limit)
            .map(|kv| kv.key.clone())
            .collect();
        if older.len() < limit {
            return self.elect(c, revision);
        }
        c.step = Step::WatchOlders {
            keys: older,
            from: revision.saturating_add(1),
            ids: Vec::new(),
        };
        self.send_step(c)
    }

    /// Whether `id` is one of the watches `c` waits with.
    pub(super) fn watches_older(c: &Campaign, id: RpcId) -> bool {
        matches!(&c.step, Step::WatchOlders { ids, .. } if ids.contains(&id))
    }

    /// An answer on one of the watches of [`Step::WatchOlders`]: a delete of
    /// a watched key may have changed my rank, so every watch is canceled
    /// and the older keys are read again; a broken watch does the same
    /// after a pause, since a delete may have gone unseen.
    pub(super) fn watch_older_reply(
        &mut self,
        mut c: Campaign,
        result: Result<Response, RpcError>,
    ) -> Op {
        let Step::WatchOlders { keys, from, ids } = c.step.clone() else {
            return Op::Campaigning(c);
        };
        let deleted = match &result {
            Ok(Response::WatchEvents { events }) => events.iter().any(|e| {
                e.kind == EventKind::Delete && e.kv.mod_revision >= from && keys.contains(&e.kv.key)
            }),
            // Canceled by etcd, failed, or an answer no watch gives.
            _ => {
                self.cancel_watches(&ids);
                c.pending = None;
                c.step = Step::FindOlder;
                return self.retry_step(c);
            }
        };
        if !deleted {
            return Op::Campaigning(c);
        }
        self.cancel_watches(&ids);
        self.backoff.reset();
        c.pending = None;
        c.step = Step::FindOlder;
        self.send_step(c)
    }

    fn cancel_watches(&mut self, ids: &[RpcId]) {
        for id in ids {
            self.outbox.cancel(*id);
        }
        self.extra_watches.clear();
    }
}
