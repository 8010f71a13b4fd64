//! The campaign steps that differ when more than one candidate may hold
//! (a semaphore of `permits` permits): join the queue, read, and wait so
//! that a waiter holds once fewer than `permits` keys are older than its
//! own. Everything else (the session, the holder's guard, the fence,
//! withdraw and resign, deadlines) is the election's, unchanged.
//!
//! Safety, for `permits` = N: a candidate holds only once it knows that at
//! one revision its key had its token and fewer than N keys were older:
//! from one read, or (the first waiter) from a read that found exactly N
//! older keys and none beyond, followed by the delete of one of them on a
//! watch of the whole prefix that showed no change of its own key up to
//! that delete. No key created later is older, so among the keys alive at
//! any instant the believed holders are the oldest; for the newest of
//! them, every other holder's key was alive and older at that revision:
//! fewer than N others.

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
            Step::WatchOlders {
                keys, from, only, ..
            } => {
                // A watch is answered when something happens, not in time.
                let (keys, from, only) = (keys.clone(), *from, *only);
                self.end_attempt(super::Timer::Attempt);
                let ids: Vec<RpcId> = if only {
                    vec![self.outbox.rpc(requests::watch_prefix(&self.prefix, from))]
                } else {
                    keys.iter()
                        .map(|key| self.outbox.rpc(requests::watch_key(key, from)))
                        .collect()
                };
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

    /// `read` is the answer of a range with `limit`, at `revision`, that
    /// holds the newest keys older than mine (and maybe mine), my key
    /// existing with my token at that revision: hold with fewer than
    /// `permits` older, else wait for the `permits` newest older ones;
    /// when the read was not cut by its limit and found no other, they
    /// are all that is ahead (see [`Step::WatchOlders`]'s `only`).
    pub(super) fn wait_or_hold(
        &mut self,
        mut c: Campaign,
        revision: Revision,
        read: &[KeyValue],
        limit: i64,
    ) -> Op {
        let permits = usize::try_from(self.permits).unwrap_or(usize::MAX);
        let mut older = read
            .iter()
            .filter(|kv| kv.create_revision < c.token && kv.key != c.key);
        let keys: Vec<Vec<u8>> = older
            .by_ref()
            .take(permits)
            .map(|kv| kv.key.clone())
            .collect();
        if keys.len() < permits {
            return self.elect(c, revision);
        }
        // A full answer may have left older keys out; a short one did not.
        let complete = i64::try_from(read.len()).is_ok_and(|n| n < limit);
        c.waited = true;
        c.step = Step::WatchOlders {
            keys,
            from: revision.saturating_add(1),
            ids: Vec::new(),
            only: complete && older.next().is_none(),
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
        let Step::WatchOlders {
            keys,
            from,
            ids,
            only,
        } = c.step.clone()
        else {
            return Op::Campaigning(c);
        };
        if only {
            if let Ok(Response::WatchEvents { events }) = &result {
                let mine_changed = events.iter().any(|e| {
                    e.kv.key == c.key
                        && (e.kind == EventKind::Delete || e.kv.create_revision != c.token)
                });
                let gone = events
                    .iter()
                    .find(|e| {
                        e.kind == EventKind::Delete
                            && e.kv.mod_revision >= from
                            && keys.contains(&e.kv.key)
                    })
                    .map(|e| e.kv.mod_revision);
                match (mine_changed, gone) {
                    // My key changed: the read finds out how, never claims.
                    (true, _) => {
                        self.cancel_watches(&ids);
                        c.pending = None;
                        c.step = Step::FindOlder;
                        return self.send_step(c);
                    }
                    // Every event up to the delete's revision has arrived
                    // on the prefix watch and none touched my key: at that
                    // revision my key is the one the read saw, and fewer
                    // than `permits` keys are older.
                    (false, Some(at)) => {
                        self.cancel_watches(&ids);
                        self.backoff.reset();
                        c.pending = None;
                        return self.elect(c, at);
                    }
                    (false, None) => return Op::Campaigning(c),
                }
            }
        }
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
