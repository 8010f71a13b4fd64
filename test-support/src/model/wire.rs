//! The explicit network between one machine and the model etcd, for the
//! model checker: nothing happens on it unless a [`WireAction`] says so.
//!
//! What real etcd and gRPC allow, and so what the actions allow:
//! 1. **Unary requests run, and their replies arrive, in any order.** Each
//!    sent request can [`WireAction::Run`] at any time; each reply can
//!    [`WireAction::Deliver`] at any time.
//! 2. **One keepalive stream, in order.** Renewals run and are answered in
//!    the order they were sent: only the oldest unrun renewal can run, only
//!    the oldest undelivered renewal reply can be delivered.
//! 3. **A watch delivers its revisions in order, without gaps**: first the
//!    creation answer, then one batch per revision from the store's history
//!    (or `WatchCanceled` once its next revision was compacted). Batches
//!    are read from the store when delivered, so a watch never holds a
//!    queue of its own.
//! 4. **A lost message ends in an error reply.** [`WireAction::Lose`] on a
//!    request that has not run answers it `Unavailable` (as the driver does
//!    when the call times out or the connection breaks), on a reply
//!    replaces it by `Unavailable` (the request did run), on a watch breaks
//!    its stream.
//! 5. **A request given up may still run later.** A request the machine
//!    cancels, or that was lost before it ran, becomes an *orphan* (when
//!    the wire keeps orphans; unary requests only); [`WireAction::Land`] runs
//!    it at etcd later, within a bound of time steps
//!    ([`Wire::age_orphans`]), and its reply goes nowhere. That is what a paused etcd member, or a
//!    request stuck in a proxy, does.
//! 6. **A canceled renewal is still answered** (with
//!    [`Wire::with_late_renewal_answers`]): the driver never aborts a
//!    renewal (`src/driver/runner.rs`), so a renewal the machine gave up
//!    stays on the keepalive stream in its place, runs at etcd, and its
//!    answer is delivered to the machine later, in order — possibly after
//!    the machine revoked that lease or granted another.

use crate::ModelEtcd;
use fleetcoord_sm::{
    Command, KeyRange, Request, Response, Revision, RpcError, RpcId, RpcReply, TxnOp, WatchEvent,
};
use std::collections::BTreeSet;
use std::time::Instant;

/// Which stream a reply travels on (rules 1–3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// A unary call: any order.
    Unary,
    /// The keepalive stream: send order.
    KeepAlive,
    /// A watch stream: its own order.
    Watch,
}

fn lane_of(request: &Request) -> Lane {
    match request {
        Request::KeepAlive { .. } => Lane::KeepAlive,
        Request::Watch { .. } => Lane::Watch,
        _ => Lane::Unary,
    }
}

/// One step on a wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireAction {
    /// Run a sent request at etcd now.
    Run(RpcId),
    /// Hand a reply (or a watch's next answer) to the machine.
    Deliver(RpcId),
    /// Lose a request, a reply or a watch stream (rule 4).
    Lose(RpcId),
    /// Run an orphan at etcd now; nobody hears the answer (rule 5).
    Land(RpcId),
}

/// How the world bends etcd, for tests that must fail.
#[derive(Clone, Debug, Default)]
pub struct Bends {
    /// Run compare-guarded deletes as if the guard held.
    pub strip_delete_guards: bool,
    /// Run compare-guarded transactions that put keys as if the guard held.
    pub strip_put_guards: bool,
    /// Revisions whose events no watch delivers.
    pub hidden: BTreeSet<Revision>,
}

#[derive(Clone, Debug)]
struct Sent {
    id: RpcId,
    request: Request,
    /// For an orphan: how many times time passed since it was given up.
    age: u32,
}

#[derive(Clone, Debug)]
struct Reply {
    id: RpcId,
    lane: Lane,
    result: Result<Response, RpcError>,
}

#[derive(Clone, Debug)]
struct OpenWatch {
    id: RpcId,
    range: KeyRange,
    next_revision: Revision,
    acked: bool,
}

/// The next answer of a watch: what [`Wire::deliver`] would hand over.
enum Next {
    Ack,
    Batch(Vec<WatchEvent>, Revision),
    Canceled(Revision),
}

/// Everything on the way between one machine and etcd.
#[derive(Clone, Debug)]
pub struct Wire {
    sent: Vec<Sent>,
    replies: Vec<Reply>,
    watches: Vec<OpenWatch>,
    orphans: Vec<Sent>,
    keep_orphans: bool,
    /// Rule 6: cancels leave renewals on the wire.
    late_renewal_answers: bool,
}

/// What taking a [`WireAction`] produced.
#[derive(Debug)]
pub enum Taken {
    /// Hand this to the machine.
    Reply(RpcReply),
    /// An orphan ran at etcd.
    Landed,
    /// Something ran or changed; nothing for the machine yet.
    Nothing,
}

impl Wire {
    /// An empty wire; with `keep_orphans`, given-up requests may land late.
    pub fn new(keep_orphans: bool) -> Self {
        Wire {
            sent: Vec::new(),
            replies: Vec::new(),
            watches: Vec::new(),
            orphans: Vec::new(),
            keep_orphans,
            late_renewal_answers: false,
        }
    }

    /// This wire with rule 6: a renewal the machine cancels is still run
    /// and answered, in its place on the keepalive stream.
    #[must_use]
    pub fn with_late_renewal_answers(mut self) -> Self {
        self.late_renewal_answers = true;
        self
    }

    /// Takes one machine command: requests go on the wire, cancels take
    /// their request off it (rule 5), notices are handed back.
    pub fn accept<N>(&mut self, command: Command<N>) -> Option<N> {
        match command {
            Command::Rpc { id, request } => {
                self.sent.push(Sent {
                    id,
                    request,
                    age: 0,
                });
                None
            }
            Command::Cancel { id } => {
                let renewal = self
                    .sent
                    .iter()
                    .any(|s| s.id == id && lane_of(&s.request) == Lane::KeepAlive)
                    || self
                        .replies
                        .iter()
                        .any(|r| r.id == id && r.lane == Lane::KeepAlive);
                if renewal && self.late_renewal_answers {
                    return None;
                }
                if let Some(i) = self.sent.iter().position(|s| s.id == id) {
                    let sent = self.sent.remove(i);
                    self.orphan(sent);
                }
                self.replies.retain(|r| r.id != id);
                self.watches.retain(|w| w.id != id);
                None
            }
            Command::Notify(notice) => Some(notice),
        }
    }

    /// Keeps a unary request given up before it ran (rule 5). A renewal
    /// landing late only lengthens the lease beyond what its machine
    /// trusts, which no property can notice; it is not kept, so that it
    /// does not multiply the states.
    fn orphan(&mut self, sent: Sent) {
        if self.keep_orphans && lane_of(&sent.request) == Lane::Unary {
            self.orphans.push(sent);
        }
    }

    /// Time passed: orphans given up more than `land_within` time steps
    /// ago are forgotten. A landing is bounded, so that where it may land
    /// does not multiply the states of a whole run.
    pub fn age_orphans(&mut self, land_within: u32) {
        for orphan in &mut self.orphans {
            orphan.age = orphan.age.saturating_add(1);
        }
        self.orphans.retain(|o| o.age <= land_within);
    }

    /// Forgets every orphan and keeps no more (no landing is left in the
    /// budget: orphans would only tell otherwise equal states apart).
    pub fn forget_orphans(&mut self) {
        self.orphans.clear();
        self.keep_orphans = false;
    }

    /// Drops everything (the client restarted): requests not yet run
    /// become orphans, replies and watches are gone.
    pub fn reset(&mut self) {
        for sent in std::mem::take(&mut self.sent) {
            self.orphan(sent);
        }
        self.replies.clear();
        self.watches.clear();
    }

    /// Whether anything but orphans is on its way (a request to run, a
    /// reply or a watch answer to deliver).
    pub fn in_flight(&self, etcd: &ModelEtcd, bends: &Bends) -> bool {
        !self.sent.is_empty()
            || !self.replies.is_empty()
            || self
                .watches
                .iter()
                .any(|w| next_of(w, etcd, bends).is_some())
    }

    /// Orphans that may still land.
    pub fn orphans(&self) -> usize {
        self.orphans.len()
    }

    /// Every enabled action: runs and deliveries always, losses with
    /// `lose`, landings with `land`.
    pub fn actions(
        &self,
        etcd: &ModelEtcd,
        bends: &Bends,
        lose: bool,
        land: bool,
        out: &mut Vec<WireAction>,
    ) {
        let first_renewal = self
            .sent
            .iter()
            .find(|s| lane_of(&s.request) == Lane::KeepAlive)
            .map(|s| s.id);
        for s in &self.sent {
            if lane_of(&s.request) == Lane::KeepAlive && Some(s.id) != first_renewal {
                continue;
            }
            out.push(WireAction::Run(s.id));
            if lose {
                out.push(WireAction::Lose(s.id));
            }
        }
        let first_renewal_reply = self
            .replies
            .iter()
            .find(|r| r.lane == Lane::KeepAlive)
            .map(|r| r.id);
        for r in &self.replies {
            if r.lane == Lane::KeepAlive && Some(r.id) != first_renewal_reply {
                continue;
            }
            out.push(WireAction::Deliver(r.id));
            if lose && r.result.is_ok() {
                out.push(WireAction::Lose(r.id));
            }
        }
        for w in &self.watches {
            if next_of(w, etcd, bends).is_some() {
                out.push(WireAction::Deliver(w.id));
            }
            if lose {
                out.push(WireAction::Lose(w.id));
            }
        }
        if land {
            out.extend(self.orphans.iter().map(|o| WireAction::Land(o.id)));
        }
    }

    /// Takes `action` (which [`Wire::actions`] listed) at `now`.
    pub fn take(
        &mut self,
        action: WireAction,
        etcd: &mut ModelEtcd,
        now: Instant,
        bends: &Bends,
    ) -> Taken {
        match action {
            WireAction::Run(id) => {
                let Some(i) = self.sent.iter().position(|s| s.id == id) else {
                    return Taken::Nothing;
                };
                let sent = self.sent.remove(i);
                match sent.request {
                    Request::Watch {
                        range,
                        start_revision,
                    } => {
                        let next_revision = if start_revision <= 0 {
                            etcd.revision() + 1
                        } else {
                            start_revision
                        };
                        self.watches.push(OpenWatch {
                            id,
                            range,
                            next_revision,
                            acked: false,
                        });
                    }
                    request => {
                        let result = run(etcd, now, &request, bends);
                        self.replies.push(Reply {
                            id,
                            lane: lane_of(&request),
                            result,
                        });
                    }
                }
                Taken::Nothing
            }
            WireAction::Deliver(id) => {
                if let Some(i) = self.replies.iter().position(|r| r.id == id) {
                    let reply = self.replies.remove(i);
                    return Taken::Reply(RpcReply {
                        id,
                        result: reply.result,
                    });
                }
                let Some(i) = self.watches.iter().position(|w| w.id == id) else {
                    return Taken::Nothing;
                };
                let result = match next_of(&self.watches[i], etcd, bends) {
                    None => return Taken::Nothing,
                    Some(Next::Ack) => {
                        self.watches[i].acked = true;
                        Response::WatchEvents { events: Vec::new() }
                    }
                    Some(Next::Batch(events, revision)) => {
                        self.watches[i].next_revision = revision + 1;
                        Response::WatchEvents { events }
                    }
                    Some(Next::Canceled(compact_revision)) => {
                        self.watches.remove(i);
                        Response::WatchCanceled { compact_revision }
                    }
                };
                Taken::Reply(RpcReply {
                    id,
                    result: Ok(result),
                })
            }
            WireAction::Lose(id) => {
                if let Some(i) = self.sent.iter().position(|s| s.id == id) {
                    let sent = self.sent.remove(i);
                    let lane = lane_of(&sent.request);
                    self.orphan(sent);
                    self.replies.push(Reply {
                        id,
                        lane,
                        result: Err(RpcError::Unavailable("model: request lost".into())),
                    });
                } else if let Some(reply) = self.replies.iter_mut().find(|r| r.id == id) {
                    reply.result = Err(RpcError::Unavailable("model: reply lost".into()));
                } else if let Some(i) = self.watches.iter().position(|w| w.id == id) {
                    self.watches.remove(i);
                    self.replies.push(Reply {
                        id,
                        lane: Lane::Watch,
                        result: Err(RpcError::Unavailable("model: watch stream broken".into())),
                    });
                }
                Taken::Nothing
            }
            WireAction::Land(id) => {
                let Some(i) = self.orphans.iter().position(|o| o.id == id) else {
                    return Taken::Nothing;
                };
                let orphan = self.orphans.remove(i);
                // Nobody waits for this answer any more.
                let _ = run(etcd, now, &orphan.request, bends);
                Taken::Landed
            }
        }
    }
}

/// Runs one request at etcd, as bent by `bends`.
fn run(
    etcd: &mut ModelEtcd,
    now: Instant,
    request: &Request,
    bends: &Bends,
) -> Result<Response, RpcError> {
    if bends.strip_delete_guards {
        if let Request::Txn(txn) = request {
            let deletes = !txn.success.is_empty()
                && txn.success.iter().all(|op| matches!(op, TxnOp::Delete(_)));
            if deletes && !txn.compare.is_empty() {
                let mut stripped = txn.clone();
                stripped.compare.clear();
                return etcd.execute(now, &Request::Txn(stripped));
            }
        }
    }
    if bends.strip_put_guards {
        if let Request::Txn(txn) = request {
            let puts = txn.success.iter().any(|op| matches!(op, TxnOp::Put { .. }));
            if puts && !txn.compare.is_empty() {
                let mut stripped = txn.clone();
                stripped.compare.clear();
                return etcd.execute(now, &Request::Txn(stripped));
            }
        }
    }
    etcd.execute(now, request)
}

/// The next answer `watch` would deliver, if any (rule 3): hidden
/// revisions are skipped as if they never happened.
fn next_of(watch: &OpenWatch, etcd: &ModelEtcd, bends: &Bends) -> Option<Next> {
    if !watch.acked {
        return Some(Next::Ack);
    }
    match etcd.watch_history(&watch.range, watch.next_revision) {
        Err(compact_revision) => Some(Next::Canceled(compact_revision)),
        Ok(events) => {
            let revision = events
                .iter()
                .map(|e| e.kv.mod_revision)
                .find(|r| !bends.hidden.contains(r))?;
            let batch = events
                .into_iter()
                .filter(|e| e.kv.mod_revision == revision)
                .collect();
            Some(Next::Batch(batch, revision))
        }
    }
}
