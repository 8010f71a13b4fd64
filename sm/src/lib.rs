//! Sans-IO state machines behind fleetcoord.
//!
//! Every piece of fleetcoord's protocol logic — lease keepalive
//! ([`keepalive`]), a host key bound to a lease ([`registration`], on a
//! lease of its own: [`host`]), many leases' renewals on one stream
//! ([`renewals`]), prefix watching with resync ([`watch`]), elections,
//! mutexes, semaphores and read-write locks ([`election`]), leader
//! observation ([`observe`]), shard map members ([`shard`]), double
//! barriers ([`barrier`]) and sequence-numbered streams ([`stream`]) —
//! lives here as a deterministic state machine; the bus's
//! decisions that need no machine (when to retry a write, [`retry`]; which message a slow
//! subscriber keeps, [`newest`]; how a shared session's facts reach the
//! primitives on it and what they may believe, [`session`]; how much of a
//! fleet-wide rate one member may spend, [`ratelimit`]) are plain
//! types beside them. This crate
//! does no I/O, reads no clock and uses no global random number generator:
//! time comes in as `now`, randomness from a seed given to `new`, and etcd
//! is reached only by emitting [`Command`]s that a driver executes. The same inputs always give the same
//! outputs, which is what lets `tests/sim.rs` and the fuzz targets sample
//! faults, and `tests/model.rs` visit every schedule of small worlds
//! (machines are `Clone`, so a world forks at every choice).
//!
//! **Stability:** the types here follow fleetcoord's needs and may change
//! in any minor version before 1.0; fleetcoord's public API exposes none
//! of them.
//!
//! # The machine contract
//!
//! Every machine implements [`Machine`]:
//!
//! * `new(config, now, seed)` builds it (an inherent constructor).
//! * [`Machine::handle`] feeds one input: an RPC reply ([`RpcReply`], which
//!   converts into every machine's input type) or a user request. In every
//!   machine, `handle` never fires a timer: only `handle_timeout` does. So a
//!   driver that has an input at `now` while `poll_timeout()` is due calls
//!   `handle_timeout(now)` first — otherwise the input would be judged by a
//!   state whose deadline has passed (a leader's session, a lease).
//!   Deadlines that decide safety are also checked against the last `now`
//!   directly (`Election::is_leader` is false from its session's deadline
//!   on, whether or not its timer has fired).
//! * [`Machine::handle_timeout`] tells it that time passed; early or repeated
//!   calls do nothing.
//! * [`Machine::stop_input`] is the input that asks it to stop (revoke,
//!   resign, cancel); [`Machine::is_finished`] says when it has, so a driver
//!   drops it then and never guesses from timers or requests in flight.
//! * Machines that feed a consumer name the inputs that pause and resume
//!   them when the consumer falls behind ([`Machine::consumer_full_input`],
//!   [`Machine::consumer_ready_input`]); the driver applies one policy to all.
//! * [`Machine::poll_command`] hands out the next command, in order.
//! * [`Machine::poll_timeout`] says when `handle_timeout` is next needed.
//!
//! Polling order: after **every** `handle*` call, drain `poll_command` until
//! it returns `None`, executing each command, then read `poll_timeout` and
//! sleep until that instant (or until the next input; if both are ready,
//! the timer goes first). `now` must never go
//! backwards, and a returned deadline is never earlier than the last `now`.
//! Notifications for users are commands too ([`Command::Notify`]), so the
//! order of "request sent" and "user told" is the machine's decision.
//! Every machine keeps its commands and RPC ids in one [`Outbox`] and the
//! last `now` it has seen in a [`Clock`], which also clamps the deadlines
//! it returns; composed machines give their parts disjoint id ranges.
//!
//! A driver loop, with the I/O left abstract:
//!
//! ```
//! use fleetcoord_sm::{Command, Machine, RpcReply, Request, RpcId};
//! use std::time::Instant;
//!
//! /// Whatever talks to etcd; here it answers nothing.
//! fn execute(_id: RpcId, _request: Request) -> Option<RpcReply> { None }
//!
//! /// `clock` is the driver's: the machines themselves never read one.
//! fn drive<M: Machine>(
//!     machine: &mut M,
//!     clock: impl Fn() -> Instant,
//!     mut notify: impl FnMut(M::Notice),
//! ) {
//!     loop {
//!         let mut replies = Vec::new();
//!         while let Some(command) = machine.poll_command() {
//!             match command {
//!                 Command::Rpc { id, request } => replies.extend(execute(id, request)),
//!                 Command::Cancel { .. } => {}
//!                 Command::Notify(n) => notify(n),
//!             }
//!         }
//!         if machine.is_finished() {
//!             return;
//!         }
//!         if let Some(reply) = replies.pop() {
//!             let now = clock();
//!             // Timers due by now go first: `handle` never fires them.
//!             if machine.poll_timeout().is_some_and(|at| at <= now) {
//!                 machine.handle_timeout(now);
//!             }
//!             machine.handle(now, reply.into());
//!             continue;
//!         }
//!         match machine.poll_timeout() {
//!             // A real driver sleeps until `at` or the next reply, whichever is first.
//!             Some(at) => machine.handle_timeout(at.max(clock())),
//!             // No timer: a real driver waits for the next input here.
//!             None => return,
//!         }
//!     }
//! }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backoff;
pub mod barrier;
pub mod clock;
pub mod election;
pub mod holder;
pub mod host;
pub mod keepalive;
pub mod kv;
pub mod liveness;
pub mod mirror;
pub mod newest;
pub mod observe;
pub mod outbox;
pub mod ratelimit;
pub mod registration;
pub mod renewals;
pub mod retry;
pub mod rpc;
pub mod session;
pub mod shard;
pub mod stream;
pub mod timer;
pub mod watch;

pub use backoff::{Backoff, BackoffConfig};
pub use clock::Clock;
pub use outbox::Outbox;
pub use rpc::{
    Command, Compare, EventKind, KeyRange, KeyValue, LeaseId, RangeRequest, Request, Response,
    Revision, RpcError, RpcId, RpcIds, RpcReply, SortOrder, Txn, TxnOp, TxnOpResponse, WatchEvent,
};
pub use timer::TimerTable;

use std::time::Instant;

/// The shape shared by every machine in this crate, so one driver loop can
/// run them all.
pub trait Machine {
    /// Inputs: RPC replies and user requests.
    type Input: From<RpcReply>;
    /// What the machine tells its user through [`Command::Notify`].
    type Notice;

    /// Feed one input observed at `now`.
    fn handle(&mut self, now: Instant, input: Self::Input);

    /// Let time pass; fires every timer due at `now`. Calls before the
    /// deadline, or repeated calls, do nothing.
    fn handle_timeout(&mut self, now: Instant);

    /// The next command, in order; `None` when the queue is empty.
    #[must_use]
    fn poll_command(&mut self) -> Option<Command<Self::Notice>>;

    /// When [`Machine::handle_timeout`] is next needed; `None` = no timer.
    #[must_use]
    fn poll_timeout(&self) -> Option<Instant>;

    /// The input that asks the machine to stop: cancel what it does,
    /// revoke or resign what it holds. Handled like any other input; the
    /// machine then works towards [`Machine::is_finished`].
    fn stop_input() -> Self::Input;

    /// Stopped with nothing left to do: no request it still waits for, no
    /// timer, no command queued. A driver may drop the machine then, and
    /// only then without cutting a revoke or resign short.
    fn is_finished(&self) -> bool;

    /// For a machine that feeds a consumer: the input telling it that the
    /// consumer's queue is full, so it stops producing (it pauses its watch)
    /// until [`Machine::consumer_ready_input`]. `None` (the default) for
    /// machines whose notices are few and must never wait.
    fn consumer_full_input() -> Option<Self::Input> {
        None
    }

    /// The input telling a paused machine that its consumer caught up: it
    /// resumes where the consumer left off (a resync diff for watches, the
    /// entry after the last delivered one for streams).
    fn consumer_ready_input() -> Option<Self::Input> {
        None
    }
}
