//! What a machine's runner receives for each of its requests, from whoever
//! runs the request: the runner itself (unary calls, watches) or the
//! renewer (renewals). A module of its own so that neither of those names
//! the other.

use fleetcoord_sm::RpcReply;

/// One reply for the machine and whether it is the last its request sends:
/// an explicit end-of-stream marker, so the runner never guesses from the
/// response variant when a request is done.
pub(crate) struct Delivery {
    pub(crate) reply: RpcReply,
    pub(crate) last: bool,
}
