//! The member's protocol: one function per rule of the module docs of
//! [`shard`](super), all driven by `reconcile`, which compares what the
//! view shows with what this member believes and sends what is missing.

use super::view::{Seen, View};
use super::{keys, placement, ShardConfig, ShardInput, ShardNotice};
use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::holder::{HolderCheck, Step, POLL};
use crate::outbox::Outbox;
use crate::rpc::{
    Command, Compare, LeaseId, Response, Revision, RpcError, RpcId, RpcReply, TxnOpResponse,
};
use crate::Machine;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// How many earlier leases are remembered for the sweep (rule 9).
const PAST_LEASES: usize = 8;

/// What a request in flight is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Read,
    Watch,
    /// The member key's guarded put.
    Register,
    /// The member key's guarded delete (leaving).
    Unregister,
    /// A shard key's create, on `lease`.
    Create {
        shard: u32,
        lease: LeaseId,
    },
    /// A shard key's guarded delete.
    Delete {
        shard: u32,
    },
    /// A look at the lease another process holds the member key on
    /// (rule 12).
    Look,
}

/// Rule 12: waiting on another process holding the member key.
#[derive(Clone, Debug)]
struct Holder {
    check: HolderCheck,
    /// When the next look goes (none while one is in flight).
    next_look: Option<Instant>,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    purpose: Purpose,
    sent: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Session {
    Down,
    Up {
        lease: LeaseId,
        until: Instant,
        /// `until − now` at the `SessionUp` that set it (rule 8).
        lifetime: Duration,
    },
}

/// A shard this member believes it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Owned {
    token: Revision,
    /// Set once `Release` was told: ownership ends then at the latest.
    release: Option<Instant>,
}

/// One member of a shard map. See the module docs of [`shard`](super) for
/// its rules and guarantees.
///
/// `Clone` copies the whole machine, queued commands included, so a model
/// checker can fork it.
#[derive(Clone, Debug)]
pub struct ShardMap {
    config: ShardConfig,
    member_key: Vec<u8>,
    session: Session,
    past_leases: VecDeque<LeaseId>,
    view: Option<View>,
    /// Per shard, whether placement names this member (rule 4); empty
    /// without a view.
    placed: Vec<bool>,
    owned: BTreeMap<u32, Owned>,
    /// Per shard, the create revision of the last key of this member a
    /// delete was sent for: a copy of that delete may still land, so that
    /// key is never believed in again (rules 6 and 9).
    doomed: BTreeMap<u32, Revision>,
    in_flight: BTreeMap<RpcId, InFlight>,
    /// Keys this member wrote (`None`: the member key; `Some(shard)`) and
    /// the revision of the write: until the view reaches it, the view
    /// shows the key as it was before, so nothing new is written to it.
    written: BTreeMap<Option<u32>, Revision>,
    /// The member key as the failure branch of its last put read it, and
    /// the revision of that read: newer than the view until the view
    /// reaches that revision, so the next put is guarded on it (rule 3).
    member_read: Option<(Revision, Option<Seen>)>,
    backoff: Backoff,
    /// Writes and reads wait until then after a failure (rule 10).
    hold_until: Option<Instant>,
    /// When the last failure that advanced the backoff was taken (rule
    /// 10): a request sent until then that fails is part of that outage.
    failed_at: Option<Instant>,
    leaving: bool,
    stopped: bool,
    /// Rule 12: the member key is another process's.
    holder: Option<Holder>,
    outbox: Outbox<ShardNotice>,
    clock: Clock,
}

impl ShardMap {
    /// A member starting at `now`: its first command reads the map. Nothing
    /// is written before a [`ShardInput::SessionUp`].
    pub fn new(config: ShardConfig, now: Instant, seed: u64) -> Self {
        Self::with_first_rpc_id(config, now, seed, 0)
    }

    /// As [`ShardMap::new`], with request ids from `first_rpc_id` on, for a
    /// driver that composes it with other machines (see [`Outbox`]).
    pub fn with_first_rpc_id(
        config: ShardConfig,
        now: Instant,
        seed: u64,
        first_rpc_id: u64,
    ) -> Self {
        let mut map = ShardMap {
            member_key: keys::member_key(&config.prefix, &config.member),
            backoff: Backoff::new(config.backoff.clone(), seed),
            config,
            session: Session::Down,
            past_leases: VecDeque::new(),
            view: None,
            placed: Vec::new(),
            owned: BTreeMap::new(),
            doomed: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            written: BTreeMap::new(),
            member_read: None,
            hold_until: None,
            failed_at: None,
            leaving: false,
            stopped: false,
            holder: None,
            outbox: Outbox::new(first_rpc_id),
            clock: Clock::new(now),
        };
        map.reconcile(now);
        map
    }

    /// Whether the session is trusted at the last `now` (rule 1).
    fn trusted(&self) -> Option<LeaseId> {
        match self.session {
            Session::Up { lease, until, .. } if self.clock.now() < until => Some(lease),
            _ => None,
        }
    }

    /// The fencing token of `shard` while this member owns it and its
    /// session is trusted; `None` from the session's local deadline on,
    /// whether or not the timer has fired.
    pub fn token(&self, shard: u32) -> Option<Revision> {
        self.trusted()?;
        self.owned.get(&shard).map(|o| o.token)
    }

    /// The shards this member owns now, with their tokens (empty from the
    /// session's local deadline on).
    pub fn owned(&self) -> Vec<(u32, Revision)> {
        if self.trusted().is_none() {
            return Vec::new();
        }
        self.owned.iter().map(|(s, o)| (*s, o.token)).collect()
    }

    /// While this member owns `shard`: the guard that fences a user's own
    /// etcd txn (`create_revision(shard key) == token`), failing once this
    /// ownership has ended, whatever this process still believes.
    pub fn fence(&self, shard: u32) -> Option<Compare> {
        let token = self.token(shard)?;
        Some(Compare::CreateRevisionEquals {
            key: keys::shard_key(&self.config.prefix, shard),
            revision: token,
        })
    }

    /// The owner of `shard` and its token as this member's view shows them
    /// (possibly behind etcd); `None` without a view or owner.
    pub fn owner_of(&self, shard: u32) -> Option<(&[u8], Revision)> {
        let seen = self.view.as_ref()?.shards.get(&shard)?;
        Some((seen.value.as_slice(), seen.create_revision))
    }

    /// The member placement names for `shard` in this member's view.
    pub fn placed_owner(&self, shard: u32) -> Option<&[u8]> {
        let view = self.view.as_ref()?;
        let me = self.config.member.as_slice();
        let leaving = self.leaving;
        placement::owner(
            view.weights().filter(move |(m, _)| !(leaving && *m == me)),
            shard,
        )
    }

    /// Rule 4: recomputes `placed` from the view's members.
    fn place(&mut self) {
        let Some(view) = &self.view else {
            self.placed.clear();
            return;
        };
        let me = self.config.member.as_slice();
        let leaving = self.leaving;
        let members = view.weights().filter(move |(m, _)| !(leaving && *m == me));
        self.placed = (0..self.config.shards)
            .map(|s| placement::owner(members.clone(), s) == Some(me))
            .collect();
    }

    fn placed_here(&self, shard: u32) -> bool {
        usize::try_from(shard)
            .ok()
            .and_then(|i| self.placed.get(i).copied())
            .unwrap_or(false)
    }

    fn send(&mut self, now: Instant, purpose: Purpose, request: crate::rpc::Request) {
        let id = self.outbox.rpc(request);
        self.in_flight.insert(id, InFlight { purpose, sent: now });
    }

    fn is_sent(&self, purpose: Purpose) -> bool {
        self.in_flight.values().any(|f| f.purpose == purpose)
    }

    fn creating(&self, shard: u32) -> bool {
        self.in_flight
            .values()
            .any(|f| matches!(f.purpose, Purpose::Create { shard: s, .. } if s == shard))
    }

    /// Whether the view has not yet caught up with a write of this member
    /// to `target` (see `written`).
    fn unseen_write(&self, target: Option<u32>) -> bool {
        let seen = self.view.as_ref().map_or(0, |v| v.revision);
        self.written.get(&target).is_some_and(|at| seen < *at)
    }

    fn holding(&self, now: Instant) -> bool {
        self.hold_until.is_some_and(|at| now < at)
    }

    /// Rule 10: a failure of a request sent at `sent` holds every new
    /// request back for one backoff delay, unless the request was sent
    /// before the failure that last did: then it is the same outage
    /// reported again, and the hold stays as it is.
    fn fail(&mut self, now: Instant, sent: Instant) {
        if self.failed_at.is_some_and(|at| sent <= at) {
            return;
        }
        let delay = self.backoff.next_delay();
        self.failed_at = Some(now);
        self.hold_until = Some(now.checked_add(delay).unwrap_or(now));
    }

    /// Rule 10: gives up requests unanswered for the attempt timeout.
    fn expire_attempts(&mut self, now: Instant) {
        let timeout = self.config.attempt_timeout;
        if timeout.is_zero() {
            return;
        }
        let expired: Vec<(RpcId, Purpose, Instant)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.purpose != Purpose::Watch)
            .filter(|(_, f)| f.sent.checked_add(timeout).is_some_and(|at| at <= now))
            .map(|(id, f)| (*id, f.purpose, f.sent))
            .collect();
        let Some(last_sent) = expired.iter().map(|(_, _, sent)| *sent).max() else {
            return;
        };
        for (id, purpose, _) in expired {
            self.in_flight.remove(&id);
            self.outbox.cancel(id);
            if purpose == Purpose::Read {
                self.view = None;
                self.place();
            }
        }
        // Requests sent together and lost together are one failure.
        self.fail(now, last_sent);
    }

    /// Rule 7: every belief ends at once.
    fn lose_all(&mut self) {
        for shard in std::mem::take(&mut self.owned).into_keys() {
            self.outbox.notify(ShardNotice::Lost { shard });
        }
    }

    /// Rule 1 and 7: a session change.
    fn session_up(&mut self, now: Instant, lease: LeaseId, until: Instant) {
        if let Session::Up { lease: old, .. } = self.session {
            if old != lease {
                self.lose_all();
                self.remember(old);
            }
        }
        let lifetime = until.saturating_duration_since(now);
        self.session = Session::Up {
            lease,
            until,
            lifetime,
        };
    }

    fn session_lost(&mut self) {
        self.lose_all();
        if let Session::Up { lease, .. } = self.session {
            self.remember(lease);
        }
        self.session = Session::Down;
    }

    fn remember(&mut self, lease: LeaseId) {
        if !self.past_leases.contains(&lease) {
            if self.past_leases.len() == PAST_LEASES {
                self.past_leases.pop_front();
            }
            self.past_leases.push_back(lease);
        }
    }

    /// Rule 2: a fresh read of the whole map.
    fn reread(&mut self, now: Instant) {
        if self.is_sent(Purpose::Read) || self.is_sent(Purpose::Watch) || self.holding(now) {
            return;
        }
        self.view = None;
        self.place();
        let request = keys::read(&self.config.prefix);
        self.send(now, Purpose::Read, request);
    }

    /// Rule 2: the read's answer becomes the view; the watch follows it.
    fn on_read(&mut self, now: Instant, sent: Instant, result: Result<Response, RpcError>) {
        match result {
            Ok(Response::Range { revision, kvs }) => {
                self.view = Some(View::read(
                    &self.config.prefix,
                    self.config.shards,
                    revision,
                    &kvs,
                ));
                self.place();
                let start = revision.saturating_add(1);
                let request = keys::watch(&self.config.prefix, start);
                self.send(now, Purpose::Watch, request);
            }
            _ => self.fail(now, sent),
        }
    }

    /// Rule 2: watch events move the view on; anything else ends the watch
    /// and the view with it.
    fn on_events(
        &mut self,
        now: Instant,
        id: RpcId,
        sent: Instant,
        result: Result<Response, RpcError>,
    ) {
        match (result, self.view.as_mut()) {
            (Ok(Response::WatchEvents { events }), Some(view)) => {
                self.in_flight.insert(
                    id,
                    InFlight {
                        purpose: Purpose::Watch,
                        sent: now,
                    },
                );
                let mut members_changed = false;
                for event in &events {
                    members_changed |= view.apply(event);
                }
                if members_changed {
                    self.place();
                }
            }
            _ => {
                self.outbox.cancel(id);
                self.view = None;
                self.place();
                self.fail(now, sent);
            }
        }
    }

    /// Rule 7: a shard whose key the view shows deleted or re-created
    /// (at a revision the view has reached) is lost.
    fn check_keys(&mut self) {
        let Some(view) = &self.view else { return };
        let gone: Vec<u32> = self
            .owned
            .iter()
            .filter(|(shard, owned)| {
                view.revision >= owned.token
                    && view.shards.get(shard).map(|s| s.create_revision) != Some(owned.token)
            })
            .map(|(shard, _)| *shard)
            .collect();
        for shard in gone {
            self.owned.remove(&shard);
            self.outbox.notify(ShardNotice::Lost { shard });
        }
    }

    /// Rule 12: whether the member key, as the view shows it, is on a
    /// lease this member never held; waits on that holder (looking at
    /// its lease when due) if so.
    fn held_elsewhere(&mut self, now: Instant, lease: LeaseId) -> bool {
        let holder = self
            .view
            .as_ref()
            .and_then(|v| v.members.get(&self.config.member))
            .map(|seen| seen.lease)
            .filter(|h| *h != 0 && *h != lease && !self.past_leases.contains(h));
        let Some(holder) = holder else {
            // Gone (or ours): the wait is over.
            self.holder = None;
            return false;
        };
        if self.holder.as_ref().map(|h| h.check.holder()) != Some(holder) {
            self.holder = Some(Holder {
                check: HolderCheck::new(holder),
                next_look: Some(now),
            });
            self.outbox.notify(ShardNotice::Waiting { holder });
        }
        let due = self
            .holder
            .as_ref()
            .and_then(|h| h.next_look)
            .is_some_and(|at| at <= now);
        if due && !self.is_sent(Purpose::Look) {
            if let Some(h) = &mut self.holder {
                h.next_look = None;
            }
            self.send(
                now,
                Purpose::Look,
                crate::rpc::Request::LeaseTimeToLive { lease: holder },
            );
        }
        true
    }

    /// Rule 12: the answer to a look at the other holder's lease.
    fn on_look(&mut self, now: Instant, sent: Instant, result: Result<Response, RpcError>) {
        let Some(h) = &mut self.holder else { return };
        let step = match result {
            Ok(Response::LeaseTimeToLive { ttl_secs, .. }) => {
                h.check.on_answer(sent, now, ttl_secs)
            }
            Err(RpcError::LeaseNotFound) => Step::Gone,
            _ => {
                h.next_look = Some(now);
                return self.fail(now, sent);
            }
        };
        match step {
            // The view shows the key's delete soon (it went with the
            // lease); until then, looked at again now and then.
            Step::Gone => h.next_look = now.checked_add(POLL),
            Step::LookAt(at) => h.next_look = Some(at),
            Step::Live => {
                let holder = h.check.holder();
                self.holder = None;
                self.outbox.notify(ShardNotice::Duplicate { holder });
                // Refused for good: every belief ends, nothing of the
                // other process's is touched, and the map is finished.
                self.lose_all();
                self.stopped = true;
                let ids: Vec<RpcId> = self.in_flight.keys().copied().collect();
                for id in ids {
                    self.outbox.cancel(id);
                }
                self.in_flight.clear();
                self.hold_until = None;
            }
        }
    }

    /// Rule 3 (and 11): the member key on the current lease, or gone when
    /// leaving.
    fn register(&mut self, now: Instant, lease: LeaseId) {
        if self.unseen_write(None) {
            return;
        }
        if !self.leaving && self.held_elsewhere(now, lease) {
            return;
        }
        let Some(view) = &self.view else { return };
        // Rule 3: what a failed guard read is newer than the view.
        let seen = match &self.member_read {
            Some((at, read)) if *at > view.revision => read.as_ref(),
            _ => view.members.get(&self.config.member),
        };
        let foreign =
            |s: &Seen| s.lease != 0 && s.lease != lease && !self.past_leases.contains(&s.lease);
        if seen.is_some_and(foreign) {
            // Read on a lease this member never held: written over by no
            // one here; rule 12 decides once the view shows it.
            return;
        }
        if self.leaving {
            // Never another process's key (rule 12).
            let ours = |s: &&super::view::Seen| {
                s.lease == lease || s.lease == 0 || self.past_leases.contains(&s.lease)
            };
            if let Some(seen) = seen.filter(ours) {
                if !self.is_sent(Purpose::Unregister) && !self.is_sent(Purpose::Register) {
                    let request =
                        keys::guarded_delete(self.member_key.clone(), seen.create_revision);
                    self.send(now, Purpose::Unregister, request);
                }
            }
            return;
        }
        let value = keys::weight_value(self.config.weight);
        let current = seen.is_some_and(|s| s.lease == lease && s.value == value);
        if current || self.is_sent(Purpose::Register) {
            return;
        }
        let mod_revision = seen.map_or(0, |s| s.mod_revision);
        let request = keys::guarded_put(self.member_key.clone(), value, lease, mod_revision);
        self.send(now, Purpose::Register, request);
    }

    /// Rule 5: creates the keys of the shards placed here that nobody
    /// holds; rule 6: adopts a key of this lease the view shows.
    /// Creates wait out a backoff (`write` false); adoptions send nothing
    /// and never wait.
    fn acquire(&mut self, now: Instant, lease: LeaseId, write: bool) {
        let Some(view) = &self.view else { return };
        let mut creates = Vec::new();
        let mut adopted = Vec::new();
        for shard in 0..self.config.shards {
            if !self.placed_here(shard)
                || self.owned.contains_key(&shard)
                || self.unseen_write(Some(shard))
            {
                continue;
            }
            match view.shards.get(&shard) {
                None if write && !self.creating(shard) => creates.push(shard),
                Some(seen)
                    if seen.lease == lease
                        && seen.value == self.config.member
                        && self.doomed.get(&shard) != Some(&seen.create_revision) =>
                {
                    adopted.push((shard, seen.create_revision));
                }
                _ => {}
            }
        }
        for (shard, token) in adopted {
            self.owned.insert(
                shard,
                Owned {
                    token,
                    release: None,
                },
            );
            self.outbox.notify(ShardNotice::Acquired { shard, token });
        }
        for shard in creates {
            let key = keys::shard_key(&self.config.prefix, shard);
            let request = keys::guarded_put(key, self.config.member.clone(), lease, 0);
            self.send(now, Purpose::Create { shard, lease }, request);
        }
    }

    /// Rule 6: a create's answer.
    fn on_create(
        &mut self,
        now: Instant,
        sent: Instant,
        shard: u32,
        lease: LeaseId,
        result: Result<Response, RpcError>,
    ) {
        let revision = match result {
            Ok(Response::Txn {
                succeeded: true,
                revision,
                ..
            }) => revision,
            _ => return self.fail(now, sent),
        };
        self.backoff.reset();
        self.written.insert(Some(shard), revision);
        // Already believed (adopted from the view before this answer), or
        // adopted and released since: a delete of it may be on its way.
        let doomed = self.doomed.get(&shard) == Some(&revision);
        if self.trusted() != Some(lease)
            || self.owned.contains_key(&shard)
            || doomed
            || self.leaving
        {
            // Not believed: the sweep (rule 9) or an adoption deals with it.
            return;
        }
        let seen_gone = self.view.as_ref().is_some_and(|view| {
            view.revision >= revision
                && view.shards.get(&shard).map(|s| s.create_revision) != Some(revision)
        });
        if seen_gone {
            return;
        }
        self.owned.insert(
            shard,
            Owned {
                token: revision,
                release: None,
            },
        );
        self.outbox.notify(ShardNotice::Acquired {
            shard,
            token: revision,
        });
    }

    /// Rule 8: tells `Release` for every owned shard placed elsewhere.
    fn start_releases(&mut self, now: Instant) {
        let lifetime = match self.session {
            Session::Up { lifetime, .. } => lifetime,
            Session::Down => Duration::ZERO,
        };
        let drain = self.config.drain.min(lifetime);
        let deadline = now.checked_add(drain).unwrap_or(now);
        let moving: Vec<u32> = self
            .owned
            .iter()
            .filter(|(shard, owned)| owned.release.is_none() && !self.placed_here(**shard))
            .map(|(shard, _)| *shard)
            .collect();
        for shard in moving {
            if let Some(owned) = self.owned.get_mut(&shard) {
                owned.release = Some(deadline);
            }
            self.outbox.notify(ShardNotice::Release { shard, deadline });
        }
    }

    /// Rule 8: ownership of `shard` ends, then its key is deleted.
    fn finish_release(&mut self, now: Instant, shard: u32) {
        let Some(owned) = self.owned.remove(&shard) else {
            return;
        };
        self.delete(now, shard, owned.token);
    }

    /// The guarded delete of `shard`'s key incarnation `create_revision`,
    /// which is never believed in again.
    fn delete(&mut self, now: Instant, shard: u32, create_revision: Revision) {
        self.doomed.insert(shard, create_revision);
        let key = keys::shard_key(&self.config.prefix, shard);
        let request = keys::guarded_delete(key, create_revision);
        self.send(now, Purpose::Delete { shard }, request);
    }

    /// Rule 9: deletes this member's keys that nobody believes in: on an
    /// earlier lease, placed elsewhere, or already doomed (a delete that
    /// failed is sent again).
    fn sweep(&mut self, now: Instant) {
        let Some(view) = &self.view else { return };
        let current = match self.session {
            Session::Up { lease, .. } => Some(lease),
            Session::Down => None,
        };
        let stale: Vec<(u32, Revision)> = view
            .shards
            .iter()
            .filter(|(shard, seen)| {
                seen.value == self.config.member
                    && !self.owned.contains_key(shard)
                    && (self.past_leases.contains(&seen.lease)
                        || (Some(seen.lease) == current
                            && (!self.placed_here(**shard)
                                || self.doomed.get(shard) == Some(&seen.create_revision))))
            })
            .map(|(shard, seen)| (*shard, seen.create_revision))
            .collect();
        for (shard, create_revision) in stale {
            if self.is_sent(Purpose::Delete { shard })
                || self.creating(shard)
                || self.unseen_write(Some(shard))
            {
                continue;
            }
            self.delete(now, shard, create_revision);
        }
    }

    /// Compares view and beliefs and sends what is missing, rule by rule.
    fn reconcile(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        if self.view.is_none() {
            self.reread(now);
        }
        if let Some(view) = &self.view {
            let seen = view.revision;
            self.written.retain(|_, at| seen < *at);
            if self.member_read.as_ref().is_some_and(|(at, _)| seen >= *at) {
                self.member_read = None;
            }
        }
        self.check_keys();
        // Without a view placement is unknown, not changed: nothing moves.
        if self.view.is_some() {
            self.start_releases(now);
        }
        let write = !self.holding(now);
        if let Some(lease) = self.trusted() {
            if write {
                self.register(now, lease);
            }
            // Rule 12: no shard is taken while the member key is another
            // process's (nor once refused).
            if !self.leaving && self.holder.is_none() && !self.stopped {
                self.acquire(now, lease, write);
            }
        }
        if self.stopped {
            return;
        }
        if write {
            self.sweep(now);
        }
        if self.leaving && self.left() {
            self.stopped = true;
            let ids: Vec<RpcId> = self.in_flight.keys().copied().collect();
            for id in ids {
                self.outbox.cancel(id);
            }
            self.in_flight.clear();
            self.hold_until = None;
        }
    }

    /// Rule 11: nothing owned, no write in flight, and, while the session
    /// is trusted, no key of this member left in the view.
    fn left(&self) -> bool {
        let writing = self
            .in_flight
            .values()
            .any(|f| !matches!(f.purpose, Purpose::Read | Purpose::Watch));
        if !self.owned.is_empty() || writing {
            return false;
        }
        if self.trusted().is_none() {
            return true;
        }
        self.view.as_ref().is_some_and(|view| {
            !view.members.contains_key(&self.config.member)
                && !view.shards.values().any(|s| s.value == self.config.member)
        })
    }

    /// Rules 3 and 9: a guarded write of the member key or a delete whose
    /// guard failed, answered with the key as it was at `revision` (the
    /// failure branch's read). etcd answered: no backoff delay. The view
    /// is behind: a put of the member key goes again at once, guarded on
    /// what was read; a delete's incarnation is gone already, and nothing
    /// more is written to that key before the view reaches `revision`
    /// and shows it as it is.
    fn on_failed_guard(
        &mut self,
        now: Instant,
        sent: Instant,
        purpose: Purpose,
        target: Option<u32>,
        revision: Revision,
        responses: &[TxnOpResponse],
    ) {
        let read = responses.first().and_then(|r| match r {
            TxnOpResponse::Range { kvs } => Some(kvs.first().map(Seen::of)),
            _ => None,
        });
        match (purpose, read) {
            (Purpose::Register, Some(read)) => self.member_read = Some((revision, read)),
            (Purpose::Unregister | Purpose::Delete { .. }, Some(_)) => {
                let at = self.written.entry(target).or_insert(revision);
                *at = (*at).max(revision);
            }
            // An answer without the read: a failure (rule 10).
            _ => self.fail(now, sent),
        }
    }

    fn reply(&mut self, now: Instant, reply: RpcReply) {
        let Some(flight) = self.in_flight.remove(&reply.id) else {
            return;
        };
        match flight.purpose {
            Purpose::Read => self.on_read(now, flight.sent, reply.result),
            Purpose::Watch => self.on_events(now, reply.id, flight.sent, reply.result),
            Purpose::Create { shard, lease } => {
                self.on_create(now, flight.sent, shard, lease, reply.result)
            }
            Purpose::Look => self.on_look(now, flight.sent, reply.result),
            Purpose::Register | Purpose::Unregister | Purpose::Delete { .. } => {
                let target = match flight.purpose {
                    Purpose::Delete { shard } => Some(shard),
                    _ => None,
                };
                match reply.result {
                    Ok(Response::Txn {
                        succeeded: true,
                        revision,
                        ..
                    }) => {
                        self.backoff.reset();
                        self.written.insert(target, revision);
                    }
                    Ok(Response::Txn {
                        succeeded: false,
                        revision,
                        responses,
                    }) => self.on_failed_guard(
                        now,
                        flight.sent,
                        flight.purpose,
                        target,
                        revision,
                        &responses,
                    ),
                    _ => self.fail(now, flight.sent),
                }
            }
        }
    }
}

impl Machine for ShardMap {
    type Input = ShardInput;
    type Notice = ShardNotice;

    fn handle(&mut self, now: Instant, input: ShardInput) {
        let now = self.clock.observe(now);
        if self.stopped {
            return;
        }
        match input {
            ShardInput::Rpc(reply) => self.reply(now, reply),
            ShardInput::SessionUp {
                lease,
                trusted_until,
            } => self.session_up(now, lease, trusted_until),
            ShardInput::SessionLost => self.session_lost(),
            ShardInput::Release { shard } => {
                if self.owned.get(&shard).is_some_and(|o| o.release.is_some()) {
                    self.finish_release(now, shard);
                }
            }
            ShardInput::Leave => {
                self.leaving = true;
                // Rule 11: the leave's writes go now, whatever hold an
                // earlier failure left.
                self.hold_until = None;
                self.place();
            }
        }
        self.reconcile(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock.observe(now);
        if self.stopped {
            return;
        }
        self.expire_attempts(now);
        if let Session::Up { until, .. } = self.session {
            if until <= now {
                self.lose_all();
            }
        }
        let due: Vec<u32> = self
            .owned
            .iter()
            .filter(|(_, o)| o.release.is_some_and(|at| at <= now))
            .map(|(s, _)| *s)
            .collect();
        for shard in due {
            self.finish_release(now, shard);
        }
        if self.hold_until.is_some_and(|at| at <= now) {
            self.hold_until = None;
        }
        self.reconcile(now);
    }

    fn poll_command(&mut self) -> Option<Command<ShardNotice>> {
        self.outbox.pop()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let trust = match self.session {
            Session::Up { until, .. } if !self.owned.is_empty() => Some(until),
            _ => None,
        };
        let releases = self.owned.values().filter_map(|o| o.release).min();
        let timeout = self.config.attempt_timeout;
        let attempts = if timeout.is_zero() {
            None
        } else {
            self.in_flight
                .values()
                .filter(|f| f.purpose != Purpose::Watch)
                .filter_map(|f| f.sent.checked_add(timeout))
                .min()
        };
        let look = self.holder.as_ref().and_then(|h| h.next_look);
        [trust, releases, attempts, self.hold_until, look]
            .into_iter()
            .flatten()
            .min()
            .map(|at| self.clock.clamp(at))
    }

    fn stop_input() -> ShardInput {
        ShardInput::Leave
    }

    fn is_finished(&self) -> bool {
        self.stopped && self.outbox.is_empty()
    }
}
