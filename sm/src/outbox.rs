//! The ordered command queue of a machine, with the RPC ids it hands out.
//!
//! Every machine keeps one [`Outbox`]: it issues [`RpcId`]s in increasing
//! order, queues [`Command::Rpc`], [`Command::Cancel`] and
//! [`Command::Notify`] in the order the machine decides, and gives them to
//! the driver through [`Machine::poll_command`](crate::Machine::poll_command)
//! via [`Outbox::pop`].
//!
//! Composed machines keep their id ranges disjoint by giving each part an
//! outbox starting at a different first id: an [`Election`] embeds a
//! [`Keepalive`] session whose ids start at 0 and a protocol whose ids start
//! far above (2^40), more than either can ever issue. A reply's id alone
//! then says which part it belongs to ([`Outbox::owns`]); the wrapper only
//! forwards its parts' commands, so its own outbox never issues ids.
//!
//! [`Election`]: crate::election::Election
//! [`Keepalive`]: crate::keepalive::Keepalive

use crate::rpc::{Command, Request, RpcId, RpcIds};
use std::collections::VecDeque;

/// A machine's commands, in order, and the ids of the requests among them.
/// `N` is the machine's notice type.
#[derive(Clone, Debug)]
pub struct Outbox<N> {
    first: u64,
    ids: RpcIds,
    queue: VecDeque<Command<N>>,
}

impl<N> Default for Outbox<N> {
    /// An empty outbox whose ids start at 0.
    fn default() -> Self {
        Self::new(0)
    }
}

impl<N> Outbox<N> {
    /// An empty outbox whose first request gets id `first_id`.
    pub fn new(first_id: u64) -> Self {
        Outbox {
            first: first_id,
            ids: RpcIds::starting_at(first_id),
            queue: VecDeque::new(),
        }
    }

    /// Queues `request` under a fresh id and returns that id, so the
    /// machine can recognise the reply.
    pub fn rpc(&mut self, request: Request) -> RpcId {
        let id = self.ids.next_id();
        self.queue.push_back(Command::Rpc { id, request });
        id
    }

    /// Queues the cancel of request `id` (a watch to stop, a request whose
    /// reply no longer matters).
    pub fn cancel(&mut self, id: RpcId) {
        self.queue.push_back(Command::Cancel { id });
    }

    /// Queues a notice for the user.
    pub fn notify(&mut self, notice: N) {
        self.queue.push_back(Command::Notify(notice));
    }

    /// Makes room for `additional` more commands at once, for a machine
    /// about to queue a page's worth of notices (growing the queue by
    /// doubling would copy it, and touch fresh memory, ten times over).
    pub fn reserve(&mut self, additional: usize) {
        self.queue.reserve(additional);
    }

    /// Queues a command as it is, for a machine forwarding the commands of
    /// the machines it is made of (their ids were issued by their outboxes).
    pub fn push(&mut self, command: Command<N>) {
        self.queue.push_back(command);
    }

    /// The oldest queued command, if any.
    pub fn pop(&mut self) -> Option<Command<N>> {
        self.queue.pop_front()
    }

    /// Whether no command is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether `id` was issued by this outbox: `first_id <= id < ` the next
    /// id it would issue. Replies to such ids belong to this machine.
    pub fn owns(&self, id: RpcId) -> bool {
        self.first <= id.0 && id < self.ids.peek()
    }
}
